"""Protocol misuse on an ext_proc stream ends in INVALID_ARGUMENT with a message, is counted by
reason and logged (rate-limited), and the EPP goes on routing (epp.server.stream)."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from epp._proto import epp_extproc_v3_pb2 as pb
from tests.conftest import body_msg, dead_ports, exchange, headers_msg, set_headers_of

pytestmark = pytest.mark.both_loops  # uvloop and asyncio (conftest.py)

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
H = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "rid"}
DEAD = dead_ports(3)
MODE = pb.ProcessingMode

REQ_TRAILERS = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
RESP_HEADERS = pb.ProcessingRequest(
    response_headers=pb.HttpHeaders(
        headers=pb.HeaderMap(headers=[pb.HeaderValue(key=":status", raw_value=b"200")])
    )
)
RESP_BODY = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"{}", end_of_stream=True))
RESP_TRAILERS = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
ROUTED = [headers_msg(H), body_msg(CHAT)]


def with_protocol_config(msg: pb.ProcessingRequest) -> pb.ProcessingRequest:
    """``msg`` with a ``protocol_config``, which Envoy sends on a stream's first message only."""
    out = pb.ProcessingRequest()
    out.CopyFrom(msg)
    out.protocol_config.request_body_mode = MODE.FULL_DUPLEX_STREAMED
    out.protocol_config.response_body_mode = MODE.FULL_DUPLEX_STREAMED
    return out


async def raw_exchange(
    app, payloads: list[bytes]
) -> tuple[list[pb.ProcessingResponse], grpc.aio.AioRpcError | None]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ch.stream_stream(
            "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            request_serializer=lambda b: b,
            response_deserializer=pb.ProcessingResponse.FromString,
        )(iter(payloads))
        out: list[pb.ProcessingResponse] = []
        try:
            async for reply in call:
                out.append(reply)
        except grpc.aio.AioRpcError as err:
            return out, err
        return out, None


def counted(app, reason: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "llm_d_epp_extproc_protocol_errors_total", {"reason": reason}
    )
    return value or 0.0


@pytest.mark.parametrize(
    ("sequence", "reason", "replies"),
    [
        pytest.param([pb.ProcessingRequest()], "no_request", 0, id="empty-message"),
        pytest.param([headers_msg(H), pb.ProcessingRequest()], "no_request", 0, id="empty-later"),
        pytest.param([body_msg(CHAT)], "request_body_before_headers", 0, id="body-first"),
        pytest.param([REQ_TRAILERS], "request_trailers_before_headers", 0, id="trailers-first"),
        pytest.param([*ROUTED, headers_msg(H)], "request_headers_repeated", 2, id="second-request"),
        pytest.param(
            [headers_msg(H), headers_msg(H)], "request_headers_repeated", 0, id="headers-twice"
        ),
        pytest.param([*ROUTED, body_msg(CHAT)], "request_body_after_end", 2, id="body-after-end"),
        pytest.param([*ROUTED, REQ_TRAILERS], "request_trailers_after_end", 2, id="late-trailers"),
        pytest.param(
            [headers_msg({":path": "/v1/models"}, end_of_stream=True), body_msg(b"{}")],
            "request_body_after_end",
            1,
            id="body-after-header-only",
        ),
        pytest.param([RESP_HEADERS], "response_before_request", 0, id="response-first"),
        pytest.param([RESP_BODY], "response_before_request", 0, id="response-body-first"),
        pytest.param(
            [headers_msg(H), RESP_HEADERS], "response_before_request", 0, id="response-unrouted"
        ),
        pytest.param([RESP_TRAILERS], "response_before_request", 0, id="resp-trailers-first"),
        pytest.param(
            [*ROUTED, RESP_HEADERS, RESP_HEADERS],
            "response_headers_repeated",
            3,
            id="response-headers-twice",
        ),
        pytest.param(
            [*ROUTED, RESP_HEADERS, RESP_BODY, RESP_BODY],
            "response_after_end",
            4,
            id="response-body-after-end",
        ),
        pytest.param(
            [*ROUTED, RESP_HEADERS, RESP_BODY, RESP_TRAILERS],
            "response_after_end",
            4,
            id="trailers-after-response-end",
        ),
        pytest.param(
            [headers_msg(H), with_protocol_config(body_msg(CHAT))],
            "protocol_config_not_first",
            0,
            id="protocol-config-on-body",
        ),
        pytest.param(
            [*ROUTED, with_protocol_config(RESP_HEADERS)],
            "protocol_config_not_first",
            2,
            id="protocol-config-on-response",
        ),
        pytest.param(
            [with_protocol_config(headers_msg(H)), with_protocol_config(body_msg(CHAT))],
            "protocol_config_not_first",
            0,
            id="protocol-config-twice",
        ),
    ],
)
async def test_misuse_ends_the_stream_with_invalid_argument(
    start_app, sequence: list[pb.ProcessingRequest], reason: str, replies: int
) -> None:
    app = await start_app(DEAD)
    got, err = await raw_exchange(app, [m.SerializeToString() for m in sequence])
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details()  # names the case
    assert len(got) == replies
    assert counted(app, reason) == 1
    # the EPP still routes
    ok = await exchange(app, [headers_msg(H), body_msg(CHAT)])
    assert set_headers_of(ok[0])["x-gateway-destination-endpoint"].startswith("127.0.0.1:")


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(b"\xff\xff\xff", id="garbage"),
        # request_headers → header map → header whose key (a proto3 string) is not UTF-8
        pytest.param(b"\x12\x09\n\x07\n\x05\n\x03\xff\xfe\xfd", id="bad-utf8-key"),
    ],
)
async def test_undecodable_bytes_are_invalid_argument_not_an_exception(
    start_app, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    app = await start_app(DEAD)
    with caplog.at_level(logging.WARNING):
        got, err = await raw_exchange(app, [payload])
    assert not got and err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "undecodable ProcessingRequest" in (err.details() or "")
    assert counted(app, "undecodable") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_misuse_is_logged_once_per_reason_then_counted(
    start_app, caplog: pytest.LogCaptureFixture
) -> None:
    app = await start_app(DEAD)
    with caplog.at_level(logging.WARNING, logger="epp.server.extproc"):
        for _ in range(5):
            await raw_exchange(app, [pb.ProcessingRequest().SerializeToString()])
    logged = [r for r in caplog.records if "ext_proc protocol error (no_request)" in r.message]
    assert len(logged) == 1
    assert counted(app, "no_request") == 5


async def test_half_close_mid_request_ends_quietly(start_app) -> None:
    app = await start_app(DEAD)
    got, err = await raw_exchange(app, [headers_msg(H).SerializeToString()])
    assert got == [] and err is None  # nothing was owed: Envoy gave up on the request


@pytest.mark.parametrize("mode", [MODE.BUFFERED, MODE.STREAMED, MODE.NONE])
async def test_non_duplex_header_reply_removes_spoofed_control_headers(
    start_app, mode: int
) -> None:
    app = await start_app(DEAD)
    first = headers_msg(
        {**H, "x-gateway-destination-endpoint": "10.6.6.6:1", "X-Prefiller-Host-Port": "x"}
    )
    first.protocol_config.request_body_mode = mode
    got = await exchange(app, [first])
    removed = set(got[0].request_headers.response.header_mutation.remove_headers)
    assert {"x-gateway-destination-endpoint", "x-prefiller-host-port"} <= removed


async def test_buffered_body_with_trailers_is_decided_on_the_body(start_app) -> None:
    app = await start_app(DEAD)
    first = headers_msg(H)
    first.protocol_config.request_body_mode = MODE.BUFFERED
    got = await exchange(app, [first, body_msg(CHAT, end_of_stream=False), REQ_TRAILERS])
    assert [r.WhichOneof("response") for r in got] == [
        "request_headers",
        "request_body",
        "request_trailers",
    ]
    dest = {
        h.header.key: h.header.raw_value
        for h in got[1].request_body.response.header_mutation.set_headers
    }
    assert dest["x-gateway-destination-endpoint"].startswith(b"127.0.0.1:")


async def test_streamed_mode_answers_each_chunk_and_never_uses_streamed_response(
    start_app,
) -> None:
    app = await start_app(DEAD)
    first = headers_msg(H)
    first.protocol_config.request_body_mode = MODE.STREAMED
    first.protocol_config.response_body_mode = MODE.STREAMED
    sse = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[
                    pb.HeaderValue(key=":status", raw_value=b"200"),
                    pb.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
                ]
            )
        )
    )
    chunk = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: {}\n\n"))
    got = await exchange(
        app,
        [first, body_msg(CHAT[:5], end_of_stream=False), body_msg(CHAT[5:]), sse, chunk, RESP_BODY],
    )
    kinds = [r.WhichOneof("response") for r in got]
    assert (
        kinds
        == ["request_headers", "request_body", "request_body", "response_headers"]
        + ["response_body"] * 2
    )
    for reply in got[4:]:
        assert not reply.response_body.response.body_mutation.HasField("streamed_response")
