"""The grpc.aio servicer's dispatch loop: replies in order, misuse as INVALID_ARGUMENT with its
message, an unexpected error as a 500, eviction while waiting for the next message, and how each
stream is counted and completed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import EVICTION_ATTRIBUTE, Eviction
from epp.plugin import TerminationCause
from epp.requestcontrol.exchange import Decision, Exchange
from epp.server.context import ServerContext
from epp.server.extproc import ExtProcServicer
from tests.unit.server.test_stream import (
    Director,
    body,
    headers,
    response_body,
    response_headers,
)

INTERNAL_BODY = b"inference error: Internal - unexpected error in the endpoint picker"


class Context:
    def __init__(self) -> None:
        self.code_: grpc.StatusCode | None = None
        self.details: str | None = None

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code_ = code

    def set_details(self, details: str) -> None:
        self.details = details

    def code(self) -> grpc.StatusCode | None:
        return self.code_


class Streams:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def started(self) -> None:
        self.events.append("started")

    def finished(self, code: str, seconds: float) -> None:
        assert 0 <= seconds < 60  # the stream's own duration
        self.events.append(code)


class Recording(Director):
    def __init__(self) -> None:
        super().__init__()
        self.evictable: Eviction | None = None
        self.hold: asyncio.Event | None = None  # routing waits for it, as in a queue
        self.route_cancelled = False

    def protocol_error(self, reason: str) -> None:
        self.calls.append(("protocol_error", reason))

    async def route(self, ex: Exchange, body: bytes, metadata: dict[str, Any]) -> Decision:
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.route_cancelled = True
                raise
        decision = await super().route(ex, body, metadata)
        if self.evictable is not None:
            ex.request.attributes[EVICTION_ATTRIBUTE] = self.evictable
        return decision


async def messages(items: Iterable[Any], gate: asyncio.Event | None = None) -> AsyncIterator[Any]:
    for item in items:
        if isinstance(item, BaseException):
            raise item
        yield item
    if gate is not None:  # the client keeps the stream open until told
        await gate.wait()


def servicer(streams: Streams | None = None) -> tuple[ExtProcServicer, Recording]:
    director = Recording()
    ctx = ServerContext(director=director, streams=streams)  # type: ignore[arg-type]
    return ExtProcServicer(ctx), director


async def run(
    svc: ExtProcServicer, items: Iterable[Any], ctx: Context
) -> list[pb.ProcessingResponse]:
    out = []
    async for reply in svc.Process(messages(items), ctx):  # type: ignore[arg-type]
        out.append(
            reply
            if isinstance(reply, pb.ProcessingResponse)
            else pb.ProcessingResponse.FromString(reply)
        )
    return out


@pytest.mark.parametrize("counted", [False, True])
async def test_a_request_is_answered_and_completed_when_the_client_half_closes(
    counted: bool,
) -> None:
    streams = Streams() if counted else None
    svc, director = servicer(streams)
    ctx = Context()
    replies = await run(svc, [headers(), body(b"{}")], ctx)
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    assert ctx.code_ is None
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)
    if streams is not None:
        assert streams.events == ["started", "OK"]


async def test_misuse_ends_with_invalid_argument_and_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streams = Streams()
    svc, director = servicer(streams)
    ctx = Context()
    with caplog.at_level(logging.WARNING, logger="epp.server.extproc"):
        assert await run(svc, [body(b"{}")], ctx) == []
    assert (ctx.code_, ctx.details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "request_body before request_headers",
    )
    assert director.calls == [("protocol_error", "request_body_before_headers")]
    assert streams.events == ["started", "InvalidArgument"]
    assert "ext_proc protocol error (request_body_before_headers)" in caplog.text


async def test_undecodable_bytes_are_misuse() -> None:
    svc, director = servicer()
    ctx = Context()
    replies = await run(svc, [headers(), DecodeError("bad wire type")], ctx)
    assert replies == [] and ctx.code_ == grpc.StatusCode.INVALID_ARGUMENT
    assert ctx.details == "undecodable ProcessingRequest: bad wire type"
    assert director.calls[-2:] == [
        ("protocol_error", "undecodable"),
        ("complete", TerminationCause.ERROR),
    ]


async def test_an_unexpected_error_is_a_500_and_the_request_completes_as_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    svc, director = servicer()

    def broken(ex: Exchange, headers: dict[str, str], served: str) -> dict[str, str]:
        raise RuntimeError("bug")

    director.on_response_headers = broken  # type: ignore[method-assign]
    ctx = Context()
    with caplog.at_level(logging.ERROR, logger="epp.server.extproc"):
        replies = await run(svc, [headers(), body(b"{}"), response_headers()], ctx)
    assert [r.WhichOneof("response") for r in replies][-1] == "immediate_response"
    assert replies[-1].immediate_response.status.code == 500
    assert replies[-1].immediate_response.body == INTERNAL_BODY
    assert ctx.code_ is None
    assert director.calls[-1] == ("complete", TerminationCause.ERROR)
    (record,) = [r for r in caplog.records if r.name == "epp.server.extproc"]
    assert record.getMessage() == "ext_proc stream failed"
    assert record.__dict__["request_kind"] == "response_headers"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


async def test_a_done_stream_stops_reading() -> None:
    svc, director = servicer()
    director.skip_response = True
    ctx = Context()
    replies = await run(svc, [headers(), body(b"{}"), body(b"never read")], ctx)
    assert len(replies) == 2 and ctx.code_ is None  # the third message is not misuse


async def test_an_error_reading_the_stream_counts_as_internal() -> None:
    streams = Streams()
    svc, _ = servicer(streams)
    with pytest.raises(OSError, match="reset"):
        await run(svc, [headers(), OSError("reset")], Context())
    assert streams.events == ["started", "Internal"]


async def test_a_client_that_goes_away_counts_as_canceled() -> None:
    streams = Streams()
    svc, _ = servicer(streams)
    gen = svc.Process(messages([headers(), body(b"{}")], asyncio.Event()), Context())  # type: ignore[arg-type]
    await anext(gen)
    await gen.aclose()
    assert streams.events == ["started", "Canceled"]


async def test_eviction_while_waiting_answers_429_and_ends_the_stream() -> None:
    svc, director = servicer()
    director.evictable = eviction = Eviction()
    gate = asyncio.Event()
    gen = svc.Process(messages([headers(), body(b"{}")], gate), Context())  # type: ignore[arg-type]
    got = [await anext(gen), await anext(gen)]
    assert len(got) == 2
    pending = asyncio.ensure_future(anext(gen))
    await asyncio.sleep(0)  # the loop now waits for the next message or the eviction
    assert not pending.done()
    eviction.fire()
    reply = await asyncio.wait_for(pending, 5)
    assert reply.immediate_response.status.code == 429
    assert reply.immediate_response.body == b"request evicted by flow control"
    with pytest.raises(StopAsyncIteration):
        await anext(gen)
    assert director.calls[-1] == ("complete", TerminationCause.EVICTED)


async def test_messages_keep_flowing_while_the_request_can_be_evicted() -> None:
    svc, director = servicer()
    director.evictable = Eviction()
    items = [headers(), body(b"{}"), response_headers(), response_body(b"x", eos=True)]
    replies = await run(svc, items, Context())
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


def kind(reply: Any) -> str | None:
    if not isinstance(reply, pb.ProcessingResponse):
        reply = pb.ProcessingResponse.FromString(reply)
    return reply.WhichOneof("response")


def queued() -> tuple[ExtProcServicer, Recording, Streams]:
    """A flow-controlled servicer whose routing waits (as in a queue) until ``hold`` is set."""
    streams = Streams()
    svc, director = servicer(streams)
    director.flow_controlled = True
    director.hold = asyncio.Event()
    return svc, director, streams


async def test_a_half_close_while_the_request_waits_in_flow_control_abandons_it() -> None:
    svc, director, streams = queued()
    ctx = Context()
    # full duplex: nothing is answered before the decision, and none is made
    assert await asyncio.wait_for(run(svc, [headers(), body(b"{}")], ctx), 5) == []
    assert director.route_cancelled and ctx.code_ is None
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)
    assert streams.events == ["started", "OK"]


async def test_messages_read_ahead_while_routing_waits_are_answered_in_order() -> None:
    svc, director, _ = queued()
    assert director.hold is not None
    open_ = asyncio.Event()
    items = [headers(), body(b"{}"), response_headers()]
    gen = svc.Process(messages(items, open_), Context())  # type: ignore[arg-type]
    pending = asyncio.ensure_future(anext(gen))
    for _ in range(10):  # the read-ahead takes response_headers while routing waits
        await asyncio.sleep(0)
    assert not pending.done()
    director.hold.set()
    kinds = [kind(await asyncio.wait_for(pending, 5))]
    while kinds[-1] != "response_headers":
        kinds.append(kind(await asyncio.wait_for(anext(gen), 5)))
    assert kinds == ["request_headers", "request_body", "response_headers"]
    assert not director.route_cancelled
    open_.set()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(gen), 5)


async def test_a_half_close_after_the_decision_still_gets_the_answer() -> None:
    svc, director, _ = queued()
    assert director.hold is not None
    director.hold.set()  # routing does not wait: the decision is made before the end is read
    director.flow_controlled = True
    replies = await asyncio.wait_for(
        run(svc, [headers(), body(b"{}"), response_headers()], Context()), 5
    )
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "response_headers"]


async def test_cancelling_the_stream_cancels_the_routing_that_waits() -> None:
    svc, director, streams = queued()
    gen = svc.Process(messages([headers(), body(b"{}")], asyncio.Event()), Context())  # type: ignore[arg-type]
    pending = asyncio.ensure_future(anext(gen))
    for _ in range(10):
        await asyncio.sleep(0)
    pending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await pending
    assert director.route_cancelled
    await gen.aclose()
    assert streams.events == ["started", "Canceled"]
