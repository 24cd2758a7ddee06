"""An ext_proc stream (``epp.server.h2.ExtProcCall``) over a real ``RequestStream`` and a recording
Director: replies in order, misuse as INVALID_ARGUMENT with its message, an unexpected error as a
500, eviction while the response streams, the flow-control half-close, and how each stream is
counted and completed."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import EVICTION_ATTRIBUTE, Eviction
from epp.plugin import TerminationCause
from epp.requestcontrol.exchange import Decision, Exchange
from epp.server import h2wire as w
from epp.server.context import ServerContext
from epp.server.h2 import ExtProcCall
from epp.server.misuse import MisuseLog
from tests.unit.server.test_stream import (
    Director,
    body,
    headers,
    response_body,
    response_headers,
)

INTERNAL_BODY = b"inference error: Internal - unexpected error in the endpoint picker"


class IO:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.sent: list[bytes] = []
        self.finished: list[tuple[int, str]] = []

    def send(self, payload: bytes) -> None:
        assert not self.finished, "a message after the trailers"
        self.sent.append(payload)

    def finish(self, code: int, message: str = "") -> None:
        self.finished.append((code, message))

    def kinds(self) -> list[str | None]:
        return [pb.ProcessingResponse.FromString(b).WhichOneof("response") for b in self.sent]

    def last(self) -> pb.ProcessingResponse:
        return pb.ProcessingResponse.FromString(self.sent[-1])


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


def new_call(streams: Streams | None = None) -> tuple[ExtProcCall, IO, Recording]:
    director, io = Recording(), IO()
    ctx = ServerContext(director=director, streams=streams)  # type: ignore[arg-type]
    return (
        ExtProcCall(io, ctx, MisuseLog(logging.getLogger("epp.server.h2"), lambda: 0.0)),
        io,
        director,
    )


async def settle() -> None:
    """Let the call's tasks run as far as they can."""
    for _ in range(20):
        await asyncio.sleep(0)


async def send(call: ExtProcCall, *msgs: pb.ProcessingRequest | bytes) -> None:
    for msg in msgs:
        call.on_message(msg if isinstance(msg, bytes) else msg.SerializeToString())
        await settle()


@pytest.mark.parametrize("counted", [False, True])
async def test_a_request_is_answered_and_completed_when_the_client_half_closes(
    counted: bool,
) -> None:
    streams = Streams() if counted else None
    call, io, director = new_call(streams)
    await send(call, headers(), body(b"{}"))
    assert io.kinds() == ["request_headers", "request_body"] and io.finished == []
    call.on_half_close()
    assert io.finished == [(w.GRPC_OK, "")]
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)
    if streams is not None:
        assert streams.events == ["started", "OK"]


async def test_misuse_ends_with_invalid_argument_and_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    streams = Streams()
    call, io, director = new_call(streams)
    with caplog.at_level(logging.WARNING, logger="epp.server.h2"):
        await send(call, body(b"{}"))
    assert io.sent == []
    assert io.finished == [(w.GRPC_INVALID_ARGUMENT, "request_body before request_headers")]
    assert director.calls == [("protocol_error", "request_body_before_headers")]
    assert streams.events == ["started", "InvalidArgument"]
    assert "ext_proc protocol error (request_body_before_headers)" in caplog.text


async def test_undecodable_bytes_are_misuse() -> None:
    call, io, director = new_call()
    await send(call, headers(), b"\xff\xff\xff")
    assert io.sent == [] and io.finished[0][0] == w.GRPC_INVALID_ARGUMENT
    assert io.finished[0][1].startswith("undecodable ProcessingRequest: ")
    assert director.calls[-2:] == [
        ("protocol_error", "undecodable"),
        ("complete", TerminationCause.ERROR),
    ]


async def test_an_unexpected_error_is_a_500_and_the_request_completes_as_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call, io, director = new_call()

    def broken(ex: Exchange, headers: dict[str, str], served: str) -> dict[str, str]:
        raise RuntimeError("bug")

    director.on_response_headers = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="epp.server.h2"):
        await send(call, headers(), body(b"{}"), response_headers())
    assert io.kinds()[-1] == "immediate_response"
    assert io.last().immediate_response.status.code == 500
    assert io.last().immediate_response.body == INTERNAL_BODY
    assert io.finished == [(w.GRPC_OK, "")]
    assert director.calls[-1] == ("complete", TerminationCause.ERROR)
    (record,) = [r for r in caplog.records if r.name == "epp.server.h2"]
    assert record.getMessage() == "ext_proc stream failed while handling a message"
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


async def test_a_done_stream_ignores_what_follows() -> None:
    call, io, _ = new_call()
    call.stream.director.skip_response = True  # type: ignore[attr-defined]
    await send(call, headers(), body(b"{}"), body(b"never read"))
    assert len(io.sent) == 2 and io.finished == [(w.GRPC_OK, "")]  # no misuse after the end


async def test_a_client_that_goes_away_counts_as_canceled() -> None:
    streams = Streams()
    call, io, director = new_call(streams)
    await send(call, headers(), body(b"{}"))
    call.on_reset()
    assert streams.events == ["started", "Canceled"] and io.finished == []
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


async def test_a_reply_over_the_send_limit_fails_the_call_as_grpc_would() -> None:
    director, io = Recording(), IO()
    ctx = ServerContext(director=director)  # type: ignore[arg-type]
    call = ExtProcCall(io, ctx, MisuseLog(logging.getLogger("t"), lambda: 0.0), max_send=10)
    await send(call, headers(), body(b"{}"))
    assert io.sent == [] and io.finished == [
        (w.GRPC_RESOURCE_EXHAUSTED, "reply over the send limit")
    ]
    assert director.calls[-1] == ("complete", TerminationCause.ERROR)


async def test_eviction_while_the_response_streams_answers_429_and_ends_the_stream() -> None:
    streams = Streams()
    call, io, director = new_call(streams)
    director.evictable = eviction = Eviction()
    await send(call, headers(), body(b"{}"), response_headers())
    assert io.kinds() == ["request_headers", "request_body", "response_headers"]
    eviction.fire()
    await settle()
    assert io.last().immediate_response.status.code == 429
    assert io.last().immediate_response.body == b"request evicted by flow control"
    assert io.finished == [(w.GRPC_OK, "")]
    assert director.calls[-1] == ("complete", TerminationCause.EVICTED)
    assert streams.events == ["started", "OK"]
    await send(call, response_body(b"late", eos=True))  # after the end: dropped
    assert io.kinds()[-1] == "immediate_response"


async def test_messages_keep_flowing_while_the_request_can_be_evicted() -> None:
    call, io, director = new_call()
    director.evictable = eviction = Eviction()
    await send(call, headers(), body(b"{}"), response_headers(), response_body(b"x", eos=True))
    assert io.kinds() == ["request_headers", "request_body", "response_headers", "response_body"]
    eviction.fire()  # the response ended: too late to evict
    await settle()
    call.on_half_close()
    assert io.kinds()[-1] == "response_body" and io.finished == [(w.GRPC_OK, "")]
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


async def test_a_stream_that_ends_stops_watching_for_eviction() -> None:
    call, _, director = new_call()
    director.evictable = Eviction()
    await send(call, headers(), body(b"{}"))
    watcher = call.evicting
    assert watcher is not None and not watcher.done()
    call.on_reset()
    await settle()
    assert watcher.cancelled() and call.evicting is None


def queued(streams: Streams | None = None) -> tuple[ExtProcCall, IO, Recording]:
    """A flow-controlled call whose routing waits (as in a queue) until ``hold`` is set."""
    call, io, director = new_call(streams)
    director.flow_controlled = True
    director.hold = asyncio.Event()
    return call, io, director


async def test_a_half_close_while_the_request_waits_in_flow_control_abandons_it() -> None:
    streams = Streams()
    call, io, director = queued(streams)
    await send(call, headers(), body(b"{}"))
    call.on_half_close()
    await settle()
    # full duplex: nothing is answered before the decision, and none is made
    assert io.sent == [] and io.finished == [(w.GRPC_OK, "")]
    assert director.route_cancelled
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)
    assert streams.events == ["started", "OK"]


async def test_messages_that_arrive_while_routing_waits_are_answered_in_order() -> None:
    call, io, director = queued()
    assert director.hold is not None
    await send(call, headers(), body(b"{}"), response_headers())
    assert io.sent == []
    director.hold.set()
    await settle()
    assert io.kinds() == ["request_headers", "request_body", "response_headers"]
    assert not director.route_cancelled and io.finished == []


async def test_a_half_close_after_the_decision_still_gets_the_answer() -> None:
    call, io, director = queued()
    assert director.hold is not None
    director.hold.set()  # routing does not wait: the decision is made at once
    await send(call, headers(), body(b"{}"))
    call.on_half_close()
    assert io.kinds() == ["request_headers", "request_body"]
    assert io.finished == [(w.GRPC_OK, "")] and not director.route_cancelled


async def test_a_call_abandoned_before_its_routing_started_leaves_no_coroutine_behind(
    recwarn: pytest.WarningsRecorder,
) -> None:
    call, io, director = queued()
    call.on_message(headers().SerializeToString())
    call.on_message(body(b"{}").SerializeToString())  # the routing task is not started yet
    call.on_half_close()
    await settle()
    import gc

    gc.collect()
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
    assert io.finished == [(w.GRPC_OK, "")]
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


async def test_a_reset_cancels_the_routing_that_waits() -> None:
    streams = Streams()
    call, io, director = queued(streams)
    await send(call, headers(), body(b"{}"))
    call.on_reset()
    await settle()
    assert director.route_cancelled and io.sent == []
    assert streams.events == ["started", "Canceled"]
