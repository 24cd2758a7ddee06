"""The h2 server's calls: an ext_proc stream driven message by message (its replies, its status,
its order while a message routes) and the health methods, each over a recording ``CallIO``."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server import h2wire as w
from epp.server.context import ServerContext
from epp.server.h2 import (
    HEALTH_CHECK,
    HEALTH_LIST,
    PROCESS,
    ExtProcCall,
    H2Server,
    HealthCall,
)
from epp.server.health import HealthServicer
from epp.server.misuse import MisuseLog, ProtocolError
from epp.server.tls import CertFiles, self_signed, server_ssl_context

HEADERS = pb.ProcessingRequest(request_headers=pb.HttpHeaders())
BODY = pb.ProcessingRequest(request_body=pb.HttpBody(body=b"{}", end_of_stream=True))
TRAILERS = pb.ProcessingRequest(response_trailers=pb.HttpTrailers())
INTERNAL_BODY = b"inference error: Internal - unexpected error in the endpoint picker"


class IO:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.finished: list[tuple[int, str]] = []

    def send(self, payload: bytes) -> None:
        self.sent.append(payload)

    def finish(self, code: int, message: str = "") -> None:
        self.finished.append((code, message))

    def replies(self) -> list[pb.ProcessingResponse]:
        return [pb.ProcessingResponse.FromString(b) for b in self.sent]


class Director:
    def __init__(self) -> None:
        self.protocol_errors: list[str] = []

    def protocol_error(self, reason: str) -> None:
        self.protocol_errors.append(reason)


Handler = Callable[[pb.ProcessingRequest], Any]


class Stream:
    """Stands in for ``RequestStream``: ``handler`` answers each message."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[str] = []
        self.done = False
        self.closed: list[bool] = []
        self.abandons = False  # what ``abandoned_on_half_close`` answers
        self.eviction = None  # never evictable
        self.first = True

    def abandoned_on_half_close(self) -> bool:
        return self.abandons

    def dispatch(self, msg: pb.ProcessingRequest) -> Any:
        self.first = False
        self.seen.append(str(msg.WhichOneof("request")))
        return self.handler(msg)

    def response_chunk(self, body: bytes, end_of_stream: bool) -> Any:  # decoded by hand
        chunk = pb.HttpBody(body=body, end_of_stream=end_of_stream)
        return self.dispatch(pb.ProcessingRequest(response_body=chunk))

    def close(self, *, error: bool) -> None:
        self.closed.append(error)


def reply(kind: str) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(**{kind: {}})


def call_with(handler: Handler) -> tuple[ExtProcCall, IO, Stream, Director]:
    io, director = IO(), Director()
    ctx = ServerContext(director=director)  # type: ignore[arg-type]
    call = ExtProcCall(io, ctx, MisuseLog(logging.getLogger("test.h2"), lambda: 0.0))
    stream = Stream(handler)
    call.stream = stream  # type: ignore[assignment]
    return call, io, stream, director


def inline(msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
    return [reply("request_headers")]


def test_inline_replies_go_out_and_half_close_ends_ok() -> None:
    call, io, stream, _ = call_with(inline)
    call.on_message(HEADERS.SerializeToString())
    assert [r.WhichOneof("response") for r in io.replies()] == ["request_headers"]
    assert io.finished == [] and stream.closed == []
    call.on_half_close()
    assert io.finished == [(w.GRPC_OK, "")] and stream.closed == [False]
    call.on_message(HEADERS.SerializeToString())  # after the end: ignored
    call.on_half_close()
    assert stream.seen == ["request_headers"] and io.finished == [(w.GRPC_OK, "")]


def test_a_done_stream_ends_with_ok_after_its_replies() -> None:
    def answer(msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        stream.done = True
        return [reply("immediate_response")]

    call, io, stream, _ = call_with(answer)
    call.on_message(HEADERS.SerializeToString())
    assert len(io.sent) == 1 and io.finished == [(w.GRPC_OK, "")] and stream.closed == [False]


def test_undecodable_bytes_end_the_call_with_invalid_argument(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call, io, stream, director = call_with(inline)
    with caplog.at_level(logging.WARNING, logger="test.h2"):
        call.on_message(b"\xff\xff\xff")
    ((code, message),) = io.finished
    assert code == w.GRPC_INVALID_ARGUMENT
    assert message.startswith("undecodable ProcessingRequest: ")
    assert io.sent == [] and stream.seen == [] and stream.closed == [True]
    assert director.protocol_errors == ["undecodable"]
    assert "ext_proc protocol error (undecodable)" in caplog.text


def test_protocol_misuse_ends_the_call_with_its_message() -> None:
    def misuse(msg: pb.ProcessingRequest) -> Any:
        raise ProtocolError("response_before_request", "a response message before ...")

    call, io, stream, director = call_with(misuse)
    call.on_message(TRAILERS.SerializeToString())
    assert io.finished == [(w.GRPC_INVALID_ARGUMENT, "a response message before ...")]
    assert director.protocol_errors == ["response_before_request"] and stream.closed == [True]


def test_an_unexpected_error_answers_500_and_ends_ok(caplog: pytest.LogCaptureFixture) -> None:
    def broken(msg: pb.ProcessingRequest) -> Any:
        raise RuntimeError("boom")

    call, io, stream, _ = call_with(broken)
    with caplog.at_level(logging.ERROR, logger="epp.server.h2"):
        call.on_message(HEADERS.SerializeToString())
    (answer,) = io.replies()
    assert answer.immediate_response.status.code == 500
    assert answer.immediate_response.body == INTERNAL_BODY
    assert io.finished == [(w.GRPC_OK, "")] and stream.closed == [True]
    assert [r.getMessage() for r in caplog.records] == [
        "ext_proc stream failed while handling a message"
    ]


class Gate:
    """A routing message's coroutine, held until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.outcome: Any = [reply("request_body")]

    async def route(self) -> list[pb.ProcessingResponse]:
        await self.release.wait()
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return list(self.outcome)


def routing(gate: Gate) -> Handler:
    def handler(msg: pb.ProcessingRequest) -> Any:
        if msg.HasField("request_body"):
            return gate.route()
        return [reply(str(msg.WhichOneof("request")))]

    return handler


async def settle(call: ExtProcCall) -> None:
    task = call.task
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 5)


async def test_messages_wait_in_order_behind_a_routing_message() -> None:
    gate = Gate()
    call, io, stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    assert call.task is not None
    call.on_message(TRAILERS.SerializeToString())
    call.on_message(BODY.SerializeToString())  # routes again, after the first
    call.on_message(HEADERS.SerializeToString())
    call.on_half_close()
    assert io.sent == [] and io.finished == []
    gate.release.set()
    await settle(call)
    kinds = [r.WhichOneof("response") for r in io.replies()]
    assert kinds == ["request_body", "response_trailers", "request_body", "request_headers"]
    assert stream.seen == ["request_body", "response_trailers", "request_body", "request_headers"]
    assert io.finished == [(w.GRPC_OK, "")] and stream.closed == [False] and call.task is None


async def test_a_routed_answer_leaves_the_call_open_until_the_client_half_closes() -> None:
    gate = Gate()
    call, io, _stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    gate.release.set()
    await settle(call)
    assert [r.WhichOneof("response") for r in io.replies()] == ["request_body"]
    assert io.finished == [] and call.task is None
    call.on_half_close()
    assert io.finished == [(w.GRPC_OK, "")]


async def test_a_routing_message_that_ends_the_stream_drops_what_waits() -> None:
    gate = Gate()

    def handler(msg: pb.ProcessingRequest) -> Any:
        if msg.HasField("request_body"):
            stream.done = True
            return gate.route()
        return [reply("request_headers")]

    call, io, stream, _ = call_with(handler)
    call.on_message(BODY.SerializeToString())
    call.on_message(HEADERS.SerializeToString())
    gate.release.set()
    await settle(call)
    assert [r.WhichOneof("response") for r in io.replies()] == ["request_body"]
    assert stream.seen == ["request_body"] and io.finished == [(w.GRPC_OK, "")]


@pytest.mark.parametrize(
    ("outcome", "finished", "sent"),
    [
        (RuntimeError("boom"), (w.GRPC_OK, ""), 1),
        (ProtocolError("no_request", "none set"), (w.GRPC_INVALID_ARGUMENT, "none set"), 0),
    ],
)
async def test_a_failed_route_ends_the_call(
    outcome: BaseException, finished: tuple[int, str], sent: int, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate()
    gate.outcome = outcome
    call, io, stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    call.on_message(HEADERS.SerializeToString())
    gate.release.set()
    with caplog.at_level(logging.ERROR, logger="epp.server.h2"):
        await settle(call)
    assert io.finished == [finished] and stream.closed == [True] and len(io.sent) == sent
    if sent:
        assert io.replies()[0].immediate_response.body == INTERNAL_BODY
        messages = [r.getMessage() for r in caplog.records if r.name == "epp.server.h2"]
        assert messages == ["ext_proc stream failed while routing"]
    assert stream.seen == ["request_body"] and call.task is None


async def test_a_reset_cancels_the_routing_message_and_closes_quietly() -> None:
    gate = Gate()
    call, io, stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    task = call.task
    assert task is not None
    await asyncio.sleep(0)  # the task runs up to the held route
    call.on_reset()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert io.sent == [] and io.finished == [] and stream.closed == [False]
    call.on_message(HEADERS.SerializeToString())
    assert stream.seen == ["request_body"]


async def test_a_half_close_that_abandons_the_request_cancels_its_routing_and_ends_ok() -> None:
    gate = Gate()
    call, io, stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    task = call.task
    assert task is not None
    await asyncio.sleep(0)  # the task runs up to the held route (a flow-control queue wait)
    stream.abandons = True
    call.on_half_close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)  # a bound on failure only
    assert io.sent == [] and io.finished == [(w.GRPC_OK, "")] and stream.closed == [False]
    assert call.task is None


async def test_a_half_close_that_does_not_abandon_waits_for_the_answer() -> None:
    gate = Gate()
    call, io, stream, _ = call_with(routing(gate))
    call.on_message(BODY.SerializeToString())
    call.on_half_close()  # ``abandons`` is False: the answer still goes out
    assert io.finished == []
    gate.release.set()
    await settle(call)
    assert [r.WhichOneof("response") for r in io.replies()] == ["request_body"]
    assert io.finished == [(w.GRPC_OK, "")] and stream.closed == [False]


class Health:
    def status(self, service: str) -> int:
        return {"readiness": 2, "liveness": 1}.get(service, 3)


def test_health_check_and_list_answer_at_half_close() -> None:
    io = IO()
    check = HealthCall(io, Health(), listing=False)  # type: ignore[arg-type]
    check.on_message(health_pb2.HealthCheckRequest(service="readiness").SerializeToString())
    assert io.sent == []
    check.on_half_close()
    assert health_pb2.HealthCheckResponse.FromString(io.sent[0]).status == 2
    assert io.finished == [(w.GRPC_OK, "")]
    io = IO()
    listing = HealthCall(io, Health(), listing=True)  # type: ignore[arg-type]
    listing.on_message(b"")
    listing.on_half_close()
    statuses = health_pb2.HealthListResponse.FromString(io.sent[0]).statuses
    assert {k: v.status for k, v in statuses.items()} == {
        "": 3,
        "liveness": 1,
        "readiness": 2,
        "envoy.service.ext_proc.v3.ExternalProcessor": 3,
    }


def test_an_undecodable_health_request_is_internal() -> None:
    io = IO()
    check = HealthCall(io, Health(), listing=False)  # type: ignore[arg-type]
    check.on_message(b"\xff\xff")
    check.on_half_close()
    assert io.sent == [] and io.finished == [(w.GRPC_INTERNAL, "undecodable health request")]


def test_routes_serve_health_only_with_health_checking() -> None:
    ctx = ServerContext(director=Director())  # type: ignore[arg-type]
    health = HealthServicer(lambda: True)
    with_health = H2Server(ctx, health, max_message=100)
    assert isinstance(with_health._route(PROCESS, IO()), ExtProcCall)
    check = with_health._route(HEALTH_CHECK, IO())
    listing = with_health._route(HEALTH_LIST, IO())
    assert isinstance(check, HealthCall) and not check.listing
    assert isinstance(listing, HealthCall) and listing.listing
    assert with_health._route("/grpc.health.v1.Health/Watch", IO()) is None
    without = H2Server(ctx, None, max_message=100)
    assert without._route(HEALTH_CHECK, IO()) is None
    assert isinstance(without._route(PROCESS, IO()), ExtProcCall)


def test_a_check_without_a_request_message_asks_for_the_overall_status() -> None:
    io = IO()
    HealthCall(io, Health(), listing=False).on_half_close()  # type: ignore[arg-type]
    assert health_pb2.HealthCheckResponse.FromString(io.sent[0]).status == 3
    assert io.finished == [(w.GRPC_OK, "")]


@pytest.mark.parametrize("own_certificate", [False, True])
async def test_tls_offers_h2_with_a_given_or_a_self_signed_certificate(
    tmp_path: Path, own_certificate: bool
) -> None:
    cert, key = self_signed()
    if own_certificate:
        (tmp_path / "tls.crt").write_bytes(cert)
        (tmp_path / "tls.key").write_bytes(key)
    files = CertFiles(str(tmp_path)) if own_certificate else None
    server_ctx = server_ssl_context(
        files, client_ca_file="", min_version="", cipher_suites=(), alpn=("h2",)
    )
    handshakes: asyncio.Queue[tuple[str | None, bytes]] = asyncio.Queue()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        handshakes.put_nowait((ssl_object.selected_alpn_protocol(), ssl_object.getpeercert(True)))
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.set_alpn_protocols(["h2", "http/1.1"])
    async with server:
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        served = writer.get_extra_info("ssl_object").getpeercert(True)
        alpn, _ = await asyncio.wait_for(handshakes.get(), 5)
        writer.close()
    assert alpn == "h2"
    pem = ssl.DER_cert_to_PEM_cert(served).encode()
    assert (pem.strip() == cert.strip()) == own_certificate
