"""The h2 server's listening socket on 127.0.0.1: calls served over real connections (plaintext
and TLS), the port it binds, ``reuse_port``, and ``stop``'s drain: GOAWAY, then the clients'
own close, or the server's after the grace period."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl

import hpack
import pytest
from grpc_health.v1 import health_pb2

from epp.server import h2wire as w
from epp.server.context import ServerContext
from epp.server.h2 import HEALTH_CHECK, PROCESS, H2Server
from epp.server.health import HealthServicer
from epp.server.tls import server_ssl_context
from tests.unit.server.test_h2 import Director

Frame = tuple[int, int, int, bytes]
DRAIN_PING = w.frame(w.PING, 0, 0, b"epp-gone")  # sent with the first GOAWAY


def server() -> H2Server:
    ctx = ServerContext(director=Director())  # type: ignore[arg-type]
    return H2Server(ctx, HealthServicer(lambda: False), max_message=1000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()

    @classmethod
    async def connect(cls, port: int, tls: ssl.SSLContext | None = None) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
        writer.write(w.PREFACE + w.settings_frame({}))
        return cls(reader, writer)

    async def frame(self) -> Frame:
        head = await asyncio.wait_for(self.reader.readexactly(9), 5)
        hi, lo, ftype, flags, sid = w.FRAME_HEADER.unpack(head)
        return ftype, flags, sid, await self.reader.readexactly((hi << 16) | lo)

    async def call(self, sid: int, path: str, message: bytes) -> tuple[bytes, dict[str, str]]:
        """One unary call: the reply message's bytes and the trailers."""
        block = self.encoder.encode([(":method", "POST"), (":path", path)])
        self.writer.write(
            w.frame(w.HEADERS, w.END_HEADERS, sid, block)
            + w.frame(w.DATA, w.END_STREAM, sid, w.grpc_message(message))
        )
        body = b""
        while True:
            ftype, flags, got, payload = await self.frame()
            if ftype == w.HEADERS and got == sid:
                fields = {k: v for k, v in self.decoder.decode(payload)}
                if flags & w.END_STREAM:
                    return body[5:], fields
            elif ftype == w.DATA and got == sid:
                body += payload

    async def check(self, sid: int, service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service).SerializeToString()
        reply, trailers = await self.call(sid, HEALTH_CHECK, request)
        assert trailers["grpc-status"] == "0"
        return int(health_pb2.HealthCheckResponse.FromString(reply).status)

    async def until(self, ftype: int) -> Frame:
        while (frame := await self.frame())[0] != ftype:
            pass
        return frame


async def test_calls_are_served_on_the_given_port_and_stop_ends_with_the_clients_close() -> None:
    port = free_port()
    srv = server()
    assert await srv.start("127.0.0.1", port, tls=None, reuse_port=False) == port
    assert [s.getsockname() for s in srv._server.sockets] == [("127.0.0.1", port)]  # type: ignore[union-attr]
    client = await Client.connect(port)
    assert await client.check(1, "readiness") == 2  # NOT_SERVING, as the servicer says
    reply, trailers = await client.call(3, PROCESS, b"\xff\xff\xff")
    assert reply == b"" and trailers["grpc-status"] == str(w.GRPC_INVALID_ARGUMENT)
    stopping = asyncio.ensure_future(srv.stop(60))
    _, _, _, payload = await client.until(w.GOAWAY)
    assert payload[4:8] == bytes(4)  # NO_ERROR
    client.writer.close()  # the client goes once told to: stop does not wait out its grace
    await asyncio.wait_for(stopping, 5)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_stop_closes_a_connection_still_open_after_the_grace_period() -> None:
    srv = server()
    port = await srv.start("127.0.0.1", 0, tls=None, reuse_port=False)
    client = await Client.connect(port)
    assert await client.check(1, "liveness") == 1
    await asyncio.wait_for(srv.stop(0.05), 5)  # the client ignores the GOAWAY
    await client.until(w.GOAWAY)
    rest = await asyncio.wait_for(client.reader.read(), 5)  # to the end: the server closed it
    assert rest == DRAIN_PING


@pytest.mark.parametrize("grace", [None, 0.0])
async def test_stop_without_grace_closes_open_connections_at_once(grace: float | None) -> None:
    srv = server()
    port = await srv.start("127.0.0.1", 0, tls=None, reuse_port=False)
    client = await Client.connect(port)
    assert await client.check(1, "liveness") == 1
    await asyncio.wait_for(srv.stop(grace), 5)
    await client.until(w.GOAWAY)
    assert await asyncio.wait_for(client.reader.read(), 5) == DRAIN_PING  # then closed


async def test_stop_with_no_connection_returns_at_once() -> None:
    srv = server()
    await asyncio.wait_for(srv.stop(60), 5)  # never started: nothing to close
    await srv.start("127.0.0.1", 0, tls=None, reuse_port=False)
    await asyncio.wait_for(srv.stop(60), 5)


async def test_reuse_port_lets_two_servers_bind_one_port() -> None:
    first, second = server(), server()
    port = await first.start("127.0.0.1", 0, tls=None, reuse_port=True)
    try:
        assert await second.start("127.0.0.1", port, tls=None, reuse_port=True) == port
    finally:
        await first.stop(None)
        await second.stop(None)


async def test_tls_serves_calls_over_h2(caplog: pytest.LogCaptureFixture) -> None:
    srv = server()
    port = await srv.start(
        "127.0.0.1",
        0,
        tls=server_ssl_context(
            None, client_ca_file="", min_version="", cipher_suites=(), alpn=("h2",)
        ),
        reuse_port=False,
    )
    tls = ssl.create_default_context()
    tls.check_hostname = False
    tls.verify_mode = ssl.CERT_NONE
    tls.set_alpn_protocols(["h2"])
    with caplog.at_level(logging.WARNING):
        client = await Client.connect(port, tls)
        assert client.writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        assert await client.check(1, "readiness") == 2
    await asyncio.wait_for(srv.stop(None), 5)
