"""``RequestStream`` message by message against a recording Director: what each body mode
answers, which headers and metadata the decision carries, the limits, the errors a client sees,
the misuse messages, and how the stream completes its request."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from google.protobuf import json_format

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import EVICTION_ATTRIBUTE, Eviction
from epp.plugin import (
    ErrorCode,
    InferenceError,
    ParseResult,
    ProfileResult,
    RequestBody,
    ResponseInfo,
    SchedulingResult,
    TerminationCause,
    wire,
)
from epp.requestcontrol.director import Director as RealDirector
from epp.requestcontrol.exchange import Decision, Exchange, Forward
from epp.server import stream as stream_module
from epp.server.context import ServerContext
from epp.server.misuse import ProtocolError
from epp.server.stream import RequestStream
from tests.builders import make_endpoint, make_request

MODE = pb.ProcessingMode
DEST = "192.168.1.1:8000"
OWNED = set(wire.OWNED_REQUEST_HEADERS)


class Director:
    """Records every call; routes to endpoint 0 unless told to fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.route_error: BaseException | None = None
        self.pick_error: InferenceError | None = None
        self.rewritten = False
        self.skip_response = False
        self.forward: Forward | None = Forward(b"out", whole=False, changed=False)
        self.flow_controlled = False
        self.skip_body = False  # what on_response_headers decides for the body
        self.response_set_headers = {"x-resp": "r"}
        self.copy_held: list[bool] = []  # per response chunk or trailers call
        self.released: list[str] = []  # request ids whose content ``sent`` dropped
        self.discovering = False  # the first discovery sync is done

    def begin(self, headers: dict[str, str]) -> Exchange:
        self.calls.append(("begin", headers))
        request_id = headers.get("x-request-id") or "generated-id"
        request = make_request(request_id=request_id, headers=headers)
        request.upstream_headers["x-up"] = "1"
        return Exchange(request, started=0.0)

    async def first_discovery(self) -> None:
        self.calls.append(("first_discovery",))
        self.discovering = False

    def pick_random(self, metadata: dict[str, Any], request: Any = None) -> Any:
        self.calls.append(("pick_random", metadata))
        if self.pick_error is not None:
            raise self.pick_error
        return make_endpoint(0)

    async def route(self, ex: Exchange, body: bytes, metadata: dict[str, Any]) -> Decision:
        self.calls.append(("route", body, metadata))
        if self.route_error is not None:
            raise self.route_error
        request = ex.request
        request.incoming_model = "asked"
        request.target_model = "served" if self.rewritten else "asked"
        eps = (make_endpoint(0), make_endpoint(1))
        result = SchedulingResult({"p": ProfileResult(eps, {eps[0].id: 0.75, "gone": 0.5})}, "p")
        parsed = ParseResult(
            "asked",
            RequestBody(kind="x", payload={}, raw=body),
            skip_response_processing=self.skip_response,
        )
        request.body = parsed.body  # as the real Director's decide
        ex.decision = Decision(request, result, None, parsed, b"forwarded!", DEST, eps)  # type: ignore[arg-type]
        return ex.decision

    def sent(self, ex: Exchange) -> None:
        self.released.append(ex.request.request_id)
        RealDirector.sent(ex)

    def fail(self, ex: Exchange | None, err: InferenceError) -> None:
        self.calls.append(("fail", err.code, err.message))

    def complete(self, ex: Exchange, cause: TerminationCause) -> None:
        assert isinstance(ex, Exchange)
        self.calls.append(("complete", cause))

    def on_response_headers(
        self, ex: Exchange, headers: dict[str, str], served: str
    ) -> dict[str, str]:
        assert isinstance(ex, Exchange)
        self.calls.append(("response_headers", headers, served))
        ex.skip_body = self.skip_body
        return dict(self.response_set_headers)

    def on_response_chunk(
        self,
        ex: Exchange,
        body: bytes,
        eos: bool,
        hold_limit: int | None,
        copy_held: bool = False,
    ) -> Forward | None:
        assert isinstance(ex, Exchange)
        self.calls.append(("chunk", body, eos, hold_limit))
        self.copy_held.append(copy_held)
        return self.forward

    def on_response_trailers(self, ex: Exchange, *, copy_held: bool) -> Forward | None:
        assert isinstance(ex, Exchange)
        self.calls.append(("trailers",))
        self.copy_held.append(copy_held)
        return self.forward

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def new_stream(**ctx: Any) -> tuple[RequestStream, Director]:
    director = Director()
    return RequestStream(ServerContext(director=director, **ctx)), director  # type: ignore[arg-type]


def headers(
    values: dict[str, str] | None = None, *, eos: bool = False, mode: int | None = None
) -> pb.ProcessingRequest:
    values = {":path": "/v1/completions", "x-request-id": "rid", **(values or {})}
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in values.items()]
            ),
            end_of_stream=eos,
        )
    )
    if mode is not None:
        msg.protocol_config.request_body_mode = mode
        msg.protocol_config.response_body_mode = mode
    return msg


def body(data: bytes, *, eos: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=data, end_of_stream=eos))


REQUEST_TRAILERS = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
RESPONSE_TRAILERS = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())


def response_headers(*, served: str = "", eos: bool = False) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(headers=[pb.HeaderValue(key=":status", raw_value=b"200")]),
            end_of_stream=eos,
        )
    )
    if served:
        msg.metadata_context.filter_metadata[wire.LB_NAMESPACE].update({wire.SERVED_HEADER: served})
    return msg


def response_body(data: bytes, *, eos: bool) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=data, end_of_stream=eos))


def parsed(replies: list[Any]) -> list[pb.ProcessingResponse]:
    return [pb.ProcessingResponse.FromString(r) if isinstance(r, bytes) else r for r in replies]


def set_of(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {o.header.key: o.header.raw_value.decode() for o in mutation.set_headers}


def lb(reply: pb.ProcessingResponse) -> dict[str, Any]:
    return dict(json_format.MessageToDict(reply.dynamic_metadata)[wire.LB_NAMESPACE])


async def send(stream: RequestStream, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    return parsed(await stream.on_message(msg))


async def test_full_duplex_answers_nothing_until_the_body_ends_then_headers_and_body() -> None:
    stream, director = new_stream()
    subset = pb.ProcessingRequest()
    subset.CopyFrom(body(b'{"a":', eos=False))
    subset.metadata_context.filter_metadata[wire.SUBSET_NAMESPACE].update({"x": ["10.0.0.1"]})
    assert await send(stream, headers()) == []
    assert await send(stream, subset) == []
    first, piece = await send(stream, body(b"1}"))
    assert director.calls[1] == ("route", b'{"a":1}', {wire.SUBSET_NAMESPACE: {"x": ["10.0.0.1"]}})
    common = first.request_headers.response
    assert common.clear_route_cache
    assert set_of(common.header_mutation) == {
        wire.DESTINATION_HEADER: DEST,
        "content-length": "10",
        "x-up": "1",
    }
    assert set(common.header_mutation.remove_headers) == OWNED - {wire.DESTINATION_HEADER}
    assert lb(first) == {wire.DESTINATION_HEADER: DEST}
    streamed = piece.request_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b"forwarded!", True)
    assert not stream.done
    # the replies carry the body; the request let it go once they were built
    ex = stream.exchange
    assert ex is not None and ex.decision is not None
    assert director.released == [ex.request.request_id]
    assert ex.decision.body == b"" and ex.decision.parsed.body.released


async def test_a_generated_request_id_is_sent_upstream() -> None:
    stream, _ = new_stream()
    await send(stream, headers({"x-request-id": ""}))
    first, _piece = await send(stream, body(b"{}"))
    sent = set_of(first.request_headers.response.header_mutation)
    assert sent[wire.REQUEST_ID_HEADER] == "generated-id"
    stream, _ = new_stream()
    await send(stream, headers())
    first, _piece = await send(stream, body(b"{}"))
    assert wire.REQUEST_ID_HEADER not in set_of(first.request_headers.response.header_mutation)


async def test_scores_ride_in_the_metadata_by_host_port_when_asked() -> None:
    stream, _ = new_stream(emit_scores=True)
    await send(stream, headers())
    first, _piece = await send(stream, body(b"{}"))
    assert lb(first) == {
        wire.DESTINATION_HEADER: DEST,
        wire.SCORES_KEY: {DEST: 0.75, "gone": 0.5},
    }


async def test_header_only_request_goes_to_a_random_endpoint_and_the_stream_stays_open() -> None:
    stream, director = new_stream()
    (reply,) = await send(stream, headers({"x-request-id": ""}, eos=True))
    assert director.names() == ["begin", "pick_random"]
    sent = set_of(reply.request_headers.response.header_mutation)
    assert sent == {
        wire.DESTINATION_HEADER: DEST,
        wire.REQUEST_ID_HEADER: "generated-id",
        "x-up": "1",
    }
    assert lb(reply) == {wire.DESTINATION_HEADER: DEST}
    assert not stream.done
    (answer,) = await send(stream, response_headers(served=DEST, eos=True))
    assert set_of(answer.response_headers.response.header_mutation) == {"x-resp": "r"}
    assert director.calls[-2][2] == DEST  # the served endpoint Envoy reported
    assert director.calls[-1] == ("complete", TerminationCause.NATURAL)


async def test_a_header_only_request_before_the_first_discovery_waits_for_it() -> None:
    stream, director = new_stream()
    director.discovering = True
    out = stream.dispatch(headers(eos=True))
    assert not isinstance(out, list)  # a coroutine: it waits for the sync, then picks
    (reply,) = parsed(await out)
    assert director.names() == ["begin", "first_discovery", "pick_random"]
    assert lb(reply) == {wire.DESTINATION_HEADER: DEST}


async def test_header_only_request_without_endpoints_fails_and_ends() -> None:
    stream, director = new_stream()
    director.pick_error = InferenceError(ErrorCode.SERVICE_UNAVAILABLE, "none")
    (reply,) = await send(stream, headers(eos=True))
    assert reply.immediate_response.status.code == 503 and stream.done
    assert director.calls[-1] == ("fail", ErrorCode.SERVICE_UNAVAILABLE, "none")


@pytest.mark.parametrize("mode", [MODE.BUFFERED, MODE.STREAMED, MODE.NONE])
async def test_other_modes_answer_the_headers_at_once_removing_control_headers(mode: int) -> None:
    stream, _ = new_stream()
    (reply,) = await send(stream, headers(mode=mode))
    common = reply.request_headers.response
    assert set(common.header_mutation.remove_headers) == OWNED
    assert not common.header_mutation.set_headers and not reply.HasField("dynamic_metadata")


@pytest.mark.parametrize("rewritten", [False, True])
async def test_buffered_decides_on_the_body_and_sends_it_only_when_rewritten(
    rewritten: bool,
) -> None:
    stream, director = new_stream()
    director.rewritten = rewritten
    await send(stream, headers(mode=MODE.BUFFERED))
    (reply,) = await send(stream, body(b"{}", eos=False))  # buffered: one message, EOS or not
    common = reply.request_body.response
    assert set_of(common.header_mutation)[wire.DESTINATION_HEADER] == DEST
    assert set(common.header_mutation.remove_headers) == OWNED - {wire.DESTINATION_HEADER}
    assert lb(reply) == {wire.DESTINATION_HEADER: DEST}
    assert common.body_mutation.body == (b"forwarded!" if rewritten else b"")
    assert len(director.released) == 1  # after the reply was built
    (trailers,) = await send(stream, REQUEST_TRAILERS)  # decided: trailers are only answered
    assert trailers == pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    assert director.names().count("route") == 1


async def test_streamed_answers_each_chunk_and_decides_at_the_end() -> None:
    stream, director = new_stream()
    director.rewritten = True
    await send(stream, headers(mode=MODE.STREAMED))
    (ack,) = await send(stream, body(b"{", eos=False))
    assert ack == pb.ProcessingResponse(request_body=pb.BodyResponse())
    (reply,) = await send(stream, body(b"}"))
    assert director.calls[-1][:2] == ("route", b"{}")
    common = reply.request_body.response
    assert set_of(common.header_mutation)[wire.DESTINATION_HEADER] == DEST
    assert not common.HasField("body_mutation")  # chunks already went: no body to replace


async def test_streamed_body_ended_by_trailers_decides_on_the_trailers() -> None:
    stream, director = new_stream()
    await send(stream, headers(mode=MODE.STREAMED))
    await send(stream, body(b"{}", eos=False))
    (reply,) = await send(stream, REQUEST_TRAILERS)
    assert reply.HasField("request_trailers") and lb(reply) == {wire.DESTINATION_HEADER: DEST}
    assert director.names().count("route") == 1


async def test_full_duplex_body_ended_by_trailers_answers_them_last() -> None:
    stream, _ = new_stream()
    await send(stream, headers())
    assert await send(stream, body(b"{}", eos=False)) == []
    kinds = [r.WhichOneof("response") for r in await send(stream, REQUEST_TRAILERS)]
    assert kinds == ["request_headers", "request_body", "request_trailers"]


async def test_a_body_over_the_limit_is_413_and_one_at_the_limit_routes() -> None:
    stream, director = new_stream(max_body_bytes=10)
    await send(stream, headers())
    assert await send(stream, body(b"12345", eos=False)) == []
    (reply,) = await send(stream, body(b"123456"))
    assert reply.immediate_response.status.code == 413 and stream.done
    assert director.calls[-1] == (
        "fail",
        ErrorCode.PAYLOAD_TOO_LARGE,
        "request body exceeds the 10-byte limit",
    )
    stream, director = new_stream(max_body_bytes=10)
    await send(stream, headers())
    await send(stream, body(b"12345", eos=False))
    replies = await send(stream, body(b"12345"))
    assert director.calls[-1][:2] == ("route", b"1234512345") and len(replies) == 2


async def test_a_body_in_chunks_ending_with_an_empty_one_routes_as_one_body() -> None:
    # Envoy's usual shape for a large prompt: two chunks, then an empty one with end of stream
    stream, director = new_stream()
    await send(stream, headers())
    assert await send(stream, body(b'{"a":', eos=False)) == []
    assert await send(stream, body(b"1}", eos=False)) == []
    assert len(await send(stream, body(b""))) == 2
    assert director.calls[-1][:2] == ("route", b'{"a":1}')


async def test_a_routing_error_is_answered_and_ends_the_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream, director = new_stream()
    director.route_error = InferenceError(ErrorCode.BAD_REQUEST, "no model")
    await send(stream, headers())
    (reply,) = await send(stream, body(b"{}"))
    assert reply.immediate_response.status.code == 400 and stream.done
    assert reply.immediate_response.body == b"inference error: BadRequest - no model"
    stream, director = new_stream()
    director.route_error = RuntimeError("bug")
    await send(stream, headers())
    with caplog.at_level(logging.ERROR, logger="epp.server.stream"):
        (reply,) = await send(stream, body(b"{}"))
    assert reply.immediate_response.status.code == 500 and stream.done
    message = "unexpected error while scheduling the request; see the EPP log"
    assert director.calls[-1] == ("fail", ErrorCode.INTERNAL, message)
    assert "unexpected error while scheduling" in caplog.text


async def test_a_request_that_skips_response_processing_ends_the_stream() -> None:
    stream, director = new_stream()
    director.skip_response = True
    await send(stream, headers())
    await send(stream, body(b"{}"))
    assert stream.done


async def test_full_duplex_response_body_goes_through_the_director_in_pieces() -> None:
    stream, director = new_stream(max_body_bytes=123)
    await send(stream, headers())
    await send(stream, body(b"{}"))
    await send(stream, response_headers())
    director.forward = None  # held
    assert await send(stream, response_body(b"part", eos=False)) == []
    assert director.calls[-1] == ("chunk", b"part", False, 123)
    director.forward = Forward(b"token", whole=False, changed=False)  # streamed: passed on
    (early,) = await send(stream, response_body(b"token", eos=False))
    streamed = early.response_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b"token", False)
    director.forward = Forward(b"whole", whole=True, changed=True)
    (piece,) = await send(stream, response_body(b"end", eos=True))
    streamed = piece.response_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b"whole", True)
    assert stream.eviction is None  # the response ended: nothing left to evict


@pytest.mark.parametrize("mode", [MODE.FULL_DUPLEX_STREAMED, MODE.STREAMED])
async def test_a_chunk_decoded_by_hand_is_handled_as_dispatch_handles_it(mode: int) -> None:
    # the server hands a response chunk it decoded itself (``messages.response_chunk``) to
    # ``response_chunk``: the same replies, director calls and response timing as ``dispatch``
    outcomes = []
    for by_hand in (False, True):
        stream, director = new_stream(max_body_bytes=123)
        await send(stream, headers(mode=mode))
        await send(stream, body(b"{}"))
        await send(stream, response_headers())
        director.forward = Forward(b"token", whole=False, changed=True)
        for data, eos in ((b"a", False), (b"b", True)):
            if by_hand:
                replies = parsed(stream.response_chunk(data, eos))
            else:
                replies = await send(stream, response_body(data, eos=eos))
            outcomes.append((by_hand, replies, director.calls[-1]))
        assert stream.response_ended and stream.response_finished
        assert stream.response_busy > 0
        with pytest.raises(ProtocolError, match="after the response ended"):
            stream.response_chunk(b"c", False)
    half = len(outcomes) // 2
    assert [o[1:] for o in outcomes[:half]] == [o[1:] for o in outcomes[half:]]


@pytest.mark.parametrize("changed", [False, True])
async def test_other_modes_answer_response_chunks_with_plain_body_replies(changed: bool) -> None:
    stream, director = new_stream(max_body_bytes=123)
    await send(stream, headers(mode=MODE.STREAMED))
    await send(stream, body(b"{}"))
    await send(stream, response_headers())
    director.forward = None
    (held,) = await send(stream, response_body(b"a", eos=False))
    assert director.calls[-1] == ("chunk", b"a", False, None)  # no hold limit outside duplex
    assert held == pb.ProcessingResponse(response_body=pb.BodyResponse(response={}))
    director.forward = Forward(b"ab", whole=True, changed=changed)
    (reply,) = await send(stream, response_body(b"b", eos=False))
    assert reply.response_body.response.body_mutation.body == (b"ab" if changed else b"")
    (last, end) = await send(stream, RESPONSE_TRAILERS)
    assert last.response_body.response.body_mutation.body == (b"ab" if changed else b"")
    assert end == pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


async def test_response_trailers_release_what_was_held() -> None:
    stream, director = new_stream()
    await send(stream, headers())
    await send(stream, body(b"{}"))
    await send(stream, response_headers())
    replies = await send(stream, RESPONSE_TRAILERS)
    streamed = replies[0].response_body.response.body_mutation.streamed_response
    assert (streamed.body, streamed.end_of_stream) == (b"out", False)
    assert replies[1].HasField("response_trailers")
    stream, director = new_stream()
    director.forward = None
    await send(stream, headers())
    await send(stream, body(b"{}"))
    assert [r.WhichOneof("response") for r in await send(stream, RESPONSE_TRAILERS)] == [
        "response_trailers"
    ]


@pytest.mark.parametrize(
    ("sequence", "message"),
    [
        ([body(b"{}")], "request_body before request_headers"),
        ([REQUEST_TRAILERS], "request_trailers before request_headers"),
        ([headers(), headers()], "request_headers a second time on one stream (one stream "
         "carries one request)"),
        ([headers(), body(b"{}"), body(b"{}")], "request_body after the request body ended"),
        ([headers(eos=True), body(b"{}")], "request_body after the request body ended"),
        ([headers(), body(b"{}"), REQUEST_TRAILERS], "request_trailers after the request ended"),
        (
            [headers(), body(b"{}", eos=False), REQUEST_TRAILERS, REQUEST_TRAILERS],
            "request_trailers after the request ended",
        ),
        (
            [
                headers(mode=MODE.BUFFERED),
                body(b"{}", eos=False),
                REQUEST_TRAILERS,
                REQUEST_TRAILERS,
            ],
            "request_trailers after the request ended",
        ),
        ([headers(), RESPONSE_TRAILERS], "a response message before the request was answered"),
        (
            [headers(), body(b"{}"), response_headers(), response_headers()],
            "response_headers a second time, or after response body",
        ),
        (
            [headers(), body(b"{}"), response_body(b"x", eos=False), response_headers()],
            "response_headers a second time, or after response body",
        ),
        (
            [headers(), body(b"{}"), response_body(b"x", eos=True), RESPONSE_TRAILERS],
            "a response message after the response ended",
        ),
        (
            [headers(), body(b"{}"), response_headers(eos=True), response_body(b"", eos=True)],
            "a response message after the response ended",
        ),
        (
            [headers(), body(b"{}"), RESPONSE_TRAILERS, RESPONSE_TRAILERS],
            "a response message after the response ended",
        ),
        (
            [pb.ProcessingRequest()],
            "ProcessingRequest sets none of request_headers, request_body, request_trailers, "
            "response_headers, response_body, response_trailers",
        ),
    ],
)  # fmt: skip
async def test_misuse_names_the_case(sequence: list[pb.ProcessingRequest], message: str) -> None:
    stream, _ = new_stream()
    for msg in sequence[:-1]:
        await stream.on_message(msg)
    with pytest.raises(ProtocolError) as err:
        await stream.on_message(sequence[-1])
    assert err.value.message == message


async def test_protocol_config_after_the_first_message_is_misuse() -> None:
    stream, director = new_stream()
    await send(stream, headers())
    late = body(b"{}")
    late.protocol_config.request_body_mode = MODE.BUFFERED
    with pytest.raises(ProtocolError) as err:
        await stream.on_message(late)
    assert err.value.reason == "protocol_config_not_first"
    assert not any(call[0] == "route" for call in director.calls)  # not routed


@pytest.mark.parametrize(
    ("steps", "error", "cause"),
    [
        ([], False, TerminationCause.CLIENT_DISCONNECT),
        ([], True, TerminationCause.ERROR),
        (["evict"], False, TerminationCause.EVICTED),
    ],
)
async def test_close_completes_the_request_with_its_cause(
    steps: list[str], error: bool, cause: TerminationCause
) -> None:
    stream, director = new_stream()
    await send(stream, headers())
    await send(stream, body(b"{}"))
    if steps:
        reply = stream.evict(
            InferenceError(ErrorCode.RESOURCE_EXHAUSTED, "evicted!", drop_reason="evicted")
        )
        assert reply.immediate_response.status.code == 429 and stream.done
        assert reply.immediate_response.body == b"evicted!"
    stream.close(error=error)
    assert director.calls[-1] == ("complete", cause)


async def test_close_before_any_request_completes_nothing() -> None:
    stream, director = new_stream()
    stream.close(error=True)
    assert director.calls == []


async def test_eviction_signal_only_while_an_evictable_request_is_in_flight() -> None:
    stream, _director = new_stream()
    assert stream.eviction is None
    await send(stream, headers())
    signal = Eviction()
    assert stream.exchange is not None
    stream.exchange.request.attributes[EVICTION_ATTRIBUTE] = signal
    assert stream.eviction is None  # not routed yet
    await send(stream, body(b"{}"))
    assert stream.eviction is signal
    stream.exchange.request.attributes[EVICTION_ATTRIBUTE] = "not a signal"
    assert stream.eviction is None
    stream.exchange.request.attributes[EVICTION_ATTRIBUTE] = signal
    stream.done = True
    assert stream.eviction is None


class Trace:
    def __init__(self, headers: dict[str, str], request_id: str) -> None:
        self.begun = (headers, request_id)
        self.error = ""
        self.status = 0
        self.events: list[Any] = []

    def headers(self) -> dict[str, str]:
        return {"traceparent": "00-abc-def-01"}

    def routed(self, error: BaseException | None = None) -> None:
        self.events.append(("routed", type(error).__name__ if error else None))

    def end(self, status: int) -> None:
        self.events.append(("end", status))


class Tracing:
    def __init__(self) -> None:
        self.traces: list[Trace] = []

    def begin(self, headers: dict[str, str], request_id: str) -> Trace:
        self.traces.append(Trace(headers, request_id))
        return self.traces[-1]


async def test_a_traced_request_propagates_its_context_and_ends_its_trace() -> None:
    tracing = Tracing()
    stream, _ = new_stream(tracing=tracing)
    await send(stream, headers())
    (trace,) = tracing.traces
    assert trace.begun[1] == "rid" and trace.begun[0]["x-request-id"] == "rid"
    first, _piece = await send(stream, body(b"{}"))
    assert set_of(first.request_headers.response.header_mutation)["traceparent"] == "00-abc-def-01"
    assert stream.exchange is not None
    stream.exchange.response = ResponseInfo("rid", {}, status=201)
    stream.close(error=False)
    assert trace.events == [("routed", None), ("end", 201)]
    assert stream.exchange.trace is None


@pytest.mark.parametrize(
    ("error", "status", "text"),
    [
        (InferenceError(ErrorCode.BAD_REQUEST, "no model"), 400, "400 BadRequest - no model"),
        (
            RuntimeError("bug"),
            500,
            "500 Internal - unexpected error while scheduling the request; see the EPP log",
        ),
    ],
)
async def test_a_traced_routing_failure_records_the_status_the_client_got(
    error: BaseException, status: int, text: str
) -> None:
    tracing = Tracing()
    stream, director = new_stream(tracing=tracing)
    director.route_error = error
    await send(stream, headers())
    await send(stream, body(b"{}"))
    (trace,) = tracing.traces
    assert trace.events == [("routed", type(error).__name__)]
    assert (trace.error, trace.status) == (text, status)
    stream.close(error=False)
    assert trace.events[-1] == ("end", status)  # no response: the error's status


async def test_a_traced_eviction_records_429() -> None:
    tracing = Tracing()
    stream, _ = new_stream(tracing=tracing)
    await send(stream, headers())
    await send(stream, body(b"{}"))
    stream.evict(InferenceError(ErrorCode.RESOURCE_EXHAUSTED, "request evicted by flow control"))
    (trace,) = tracing.traces
    assert (trace.error, trace.status) == ("429 request evicted by flow control", 429)


class Histogram:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, value: float) -> None:
        self.values.append(value)


class Metrics:
    def __init__(self) -> None:
        self.request_processing = Histogram()
        self.response_processing = Histogram()


class TimedDirector(Director):
    def begin(self, headers: dict[str, str]) -> Exchange:
        ex = super().begin(headers)
        ex.started = time.monotonic()
        return ex


@pytest.mark.parametrize("fails", [False, True])
async def test_request_processing_time_is_observed_once_the_body_is_handled(fails: bool) -> None:
    metrics = Metrics()
    director = TimedDirector()
    if fails:
        director.route_error = InferenceError(ErrorCode.BAD_REQUEST, "x")
    stream = RequestStream(ServerContext(director=director, metrics=metrics))  # type: ignore[arg-type]
    await send(stream, headers())
    await send(stream, body(b"{", eos=False))
    assert metrics.request_processing.values == []
    await send(stream, body(b"}"))
    (seconds,) = metrics.request_processing.values
    assert 0 <= seconds < 60
    stream.close(error=False)
    assert metrics.response_processing.values == []  # no response came


class Clock:
    """``time`` for the stream: ``monotonic`` is set by the test; each ``perf_counter`` reading
    is 0.25 s after the previous one (so each response message takes 0.25 s to handle)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.perf = 0.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        self.perf += 0.25
        return self.perf


@pytest.mark.parametrize(
    ("streaming", "ends", "seconds"),
    [
        (False, True, 5.0),  # response headers to the response's end
        (False, False, 10.0),  # never ended: to the stream's close
        (True, True, 0.75),  # a streamed response: only the time spent on its messages
    ],
)
async def test_response_processing_time_by_response_kind(
    monkeypatch: pytest.MonkeyPatch, streaming: bool, ends: bool, seconds: float
) -> None:
    clock = Clock()
    monkeypatch.setattr(stream_module, "time", clock)
    metrics = Metrics()
    stream, director = new_stream(metrics=metrics)
    await send(stream, headers())
    await send(stream, body(b"{}"))
    await send(stream, response_headers())
    assert stream.exchange is not None
    stream.exchange.response = ResponseInfo("rid", {}, streaming=streaming)
    clock.now = 102.0
    await send(stream, response_body(b"x", eos=False))
    clock.now = 105.0
    await send(stream, response_body(b"y", eos=ends))
    clock.now = 110.0
    stream.close(error=False)
    assert metrics.response_processing.values == [seconds]
    assert director.calls[-1] == ("complete", TerminationCause.CLIENT_DISCONNECT)


@pytest.mark.parametrize("flow_controlled", [False, True])
async def test_a_half_close_abandons_only_a_flow_controlled_request_awaiting_its_decision(
    flow_controlled: bool,
) -> None:
    stream, director = new_stream()
    director.flow_controlled = flow_controlled
    assert not stream.abandoned_on_half_close()  # no request yet
    stream.dispatch(headers())
    assert not stream.abandoned_on_half_close()  # the body is still coming
    routing = stream.dispatch(body(b"{}", eos=True))
    assert stream.abandoned_on_half_close() is flow_controlled  # the decision is pending
    assert not isinstance(routing, list)
    await routing
    assert not stream.abandoned_on_half_close()  # decided: the answer goes out
