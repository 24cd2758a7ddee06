"""HTTP/2 attacks on the ext_proc server's real listener (``H2Server`` on 127.0.0.1), each from a
raw socket with hand-built frames: every attack ends in the GOAWAY or RST_STREAM it should, at a
bounded cost (CPU of this process, attacker included; RSS growth; time), and afterwards a
well-behaved gRPC client on a new connection is served (a health Check and an ext_proc call).

The bounds are loose on purpose, for a shared 2-core machine: they catch a server that spends
seconds or hundreds of MiB on an attack, not a few percent."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import struct
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server import extproc_rpc, h2limits
from epp.server import h2wire as w
from epp.server.context import ServerContext
from epp.server.h2 import HEALTH_CHECK, PROCESS, H2Server
from epp.server.health import HealthServicer
from tests.unit.server.test_h2 import Director

pytestmark = pytest.mark.both_loops  # uvloop and asyncio (conftest.py)

Frame = tuple[int, int, int, bytes]
SERVING = health_pb2.HealthCheckResponse.SERVING
CHECK = health_pb2.HealthCheckRequest(service="liveness").SerializeToString()


@dataclass
class Served:
    server: H2Server
    port: int


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    ctx = ServerContext(director=Director())  # type: ignore[arg-type]
    srv = H2Server(ctx, HealthServicer(lambda: True), max_message=1 << 20)
    port = await srv.start("127.0.0.1", 0, tls=None, reuse_port=False)
    yield Served(srv, port)
    await srv.stop(None)


def rss() -> int:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


@dataclass
class Cost:
    cpu: float = 0.0
    wall: float = 0.0
    rss: int = 0


@contextmanager
def cost() -> Iterator[Cost]:
    c = Cost()
    cpu, wall, mem = time.process_time(), time.monotonic(), rss()
    yield c
    c.cpu, c.wall, c.rss = time.process_time() - cpu, time.monotonic() - wall, rss() - mem


class Raw:
    """A client that writes what it is told and reads frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder = hpack.Encoder()

    @classmethod
    async def connect(cls, port: int, settings: dict[int, int] | None = None) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        # the client's preface and SETTINGS, and the ACK of the server's (it sends them first)
        writer.write(w.PREFACE + w.settings_frame(settings or {}) + w.frame(w.SETTINGS, w.ACK, 0))
        return cls(reader, writer)

    def headers(self, sid: int, path: str = HEALTH_CHECK, *, end: bool = False) -> bytes:
        block = self.encoder.encode(
            [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "epp")]
        )
        return w.frame(w.HEADERS, w.END_HEADERS | (w.END_STREAM if end else 0), sid, block)

    def check(self, sid: int) -> bytes:
        """A whole health Check call on stream ``sid``."""
        message = w.frame(w.DATA, w.END_STREAM, sid, w.grpc_message(CHECK))
        return self.headers(sid) + message

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frames(self, timeout: float = 20.0) -> list[Frame]:
        """Every frame until the server closes the connection."""
        out = []
        async with asyncio.timeout(timeout):
            while head := await self.reader.read(9):
                head += await self.reader.readexactly(9 - len(head))
                hi, lo, ftype, flags, sid = w.FRAME_HEADER.unpack(head)
                out.append((ftype, flags, sid, await self.reader.readexactly((hi << 16) | lo)))
        self.writer.close()
        return out


def goaway(frames: list[Frame]) -> tuple[int, int, bytes]:
    """The connection's GOAWAY (the last one): last stream id, error code, debug text."""
    gone = [f for f in frames if f[0] == w.GOAWAY]
    assert gone, f"no GOAWAY in {[f[0] for f in frames]}"
    last, code = struct.unpack(">II", gone[-1][3][:8])
    return last, code, gone[-1][3][8:]


async def attack(port: int, wire: bytes, settings: dict[int, int] | None = None) -> list[Frame]:
    client = await Raw.connect(port, settings)
    with contextlib.suppress(ConnectionError):  # the server closed first: read what it sent
        await client.send(wire)
    return await client.frames()


async def serving(port: int) -> None:
    """A new, well-behaved connection is served: a health Check and an ext_proc call (its
    message is not a ProcessingRequest, so the call ends with INVALID_ARGUMENT)."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        check = await health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
        assert check.status == SERVING
        call = extproc_rpc.process(ch)(iter([pb.ProcessingRequest()]), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in call:
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_rapid_reset_ends_in_a_goaway_once_the_reset_budget_is_spent(served: Served) -> None:
    client = await Raw.connect(served.port)
    streams = 4 * h2limits.RESET_BURST
    wire = b"".join(
        client.headers(2 * i + 1) + w.rst_stream(2 * i + 1, w.CANCEL) for i in range(streams)
    )
    with cost() as c:
        await client.send(wire)
        last, code, _ = goaway(await client.frames())
    assert code == w.INTERNAL_ERROR  # libnghttp2's code for it
    # the streams after the budget were never processed
    assert last < 2 * (h2limits.RESET_BURST + h2limits.RESET_RATE * (c.wall + 1)) + 1
    assert c.cpu < 5.0 and c.rss < 64 << 20
    await serving(served.port)


async def test_a_continuation_flood_ends_in_enhance_your_calm(served: Served) -> None:
    client = await Raw.connect(served.port)
    head = client.headers(1)
    block = head[9:]
    wire = w.frame(w.HEADERS, 0, 1, block[:3])
    wire += w.frame(w.CONTINUATION, 0, 1, b"") * 20_000
    with cost() as c:
        await client.send(wire)
        _, code, text = goaway(await client.frames())
    assert code == w.ENHANCE_YOUR_CALM and b"CONTINUATION" in text
    assert c.cpu < 5.0 and c.rss < 64 << 20
    await serving(served.port)


def _literal(name: bytes, value: bytes) -> bytes:
    """A literal header field with incremental indexing, new name, no Huffman (RFC 7541)."""

    def string(raw: bytes) -> bytes:
        n, out = len(raw), bytearray()
        if n < 127:
            return bytes([n]) + raw
        out.append(127)
        n -= 127
        while n >= 128:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out) + raw

    return b"\x40" + string(name) + string(value)


async def test_an_hpack_bomb_ends_at_the_header_list_limit(served: Served) -> None:
    client = await Raw.connect(served.port)
    head = client.headers(1)[9:]
    # one 4,000-byte field enters the dynamic table (index 62), then 8,000 one-byte references
    # to it: a 8 KB block that decodes to 32 MB
    block = head + _literal(b"x-bomb", b"b" * 4000) + b"\xbe" * 8000
    wire = w.frame(w.HEADERS, 0, 1, block[:16_000]) + w.frame(
        w.CONTINUATION, w.END_HEADERS, 1, block[16_000:]
    )
    with cost() as c:
        await client.send(wire)
        _, code, _ = goaway(await client.frames())
    assert code == w.ENHANCE_YOUR_CALM
    assert c.cpu < 5.0 and c.rss < 64 << 20
    await serving(served.port)


async def test_a_header_list_over_the_limit_ends_the_connection(served: Served) -> None:
    client = await Raw.connect(served.port)
    fields = [_literal(f"x-big-{i}".encode(), b"v" * 9000) for i in range(8)]  # 72 KB
    frames = [client.headers(1)[9:], *fields]
    wire = w.frame(w.HEADERS, 0, 1, frames[0])
    for i, piece in enumerate(frames[1:]):
        wire += w.frame(w.CONTINUATION, w.END_HEADERS if i == 7 else 0, 1, piece)
    await client.send(wire)
    _, code, _ = goaway(await client.frames())
    assert code == w.ENHANCE_YOUR_CALM
    await serving(served.port)


@pytest.mark.parametrize(
    "flood",
    [w.settings_frame({}), w.frame(w.PING, 0, 0, b"floodme!")],
    ids=["settings", "ping"],
)
async def test_a_settings_or_ping_flood_ends_in_enhance_your_calm(
    served: Served, flood: bytes
) -> None:
    with cost() as c:
        frames = await attack(served.port, flood * 50_000)
    assert goaway(frames)[1] == w.ENHANCE_YOUR_CALM
    assert c.cpu < 5.0 and c.rss < 64 << 20
    await serving(served.port)


async def test_pings_faster_than_the_minimum_interval_end_with_too_many_pings(
    served: Served,
) -> None:
    client = await Raw.connect(served.port)
    for i in range(h2limits.MAX_PING_STRIKES + 2):  # the first is free, then the strikes
        await client.send(w.frame(w.PING, 0, 0, struct.pack(">Q", i)))
        await asyncio.sleep(0.01)
    _, code, text = goaway(await client.frames())
    assert (code, text) == (w.ENHANCE_YOUR_CALM, b"too_many_pings")
    await serving(served.port)


MALFORMED = {
    "window update past 2^31-1, connection": (
        w.window_update(0, w.MAX_WINDOW),
        w.FLOW_CONTROL_ERROR,
    ),
    "zero window increment, connection": (w.window_update(0, 0), w.PROTOCOL_ERROR),
    "settings not a multiple of 6": (w.frame(w.SETTINGS, 0, 0, bytes(7)), w.FRAME_SIZE_ERROR),
    "ping of 7 bytes": (w.frame(w.PING, 0, 0, bytes(7)), w.FRAME_SIZE_ERROR),
    "window update of 3 bytes": (w.frame(w.WINDOW_UPDATE, 0, 0, bytes(3)), w.FRAME_SIZE_ERROR),
    "rst_stream of 3 bytes": (w.frame(w.RST_STREAM, 0, 1, bytes(3)), w.FRAME_SIZE_ERROR),
    "priority of 4 bytes": (w.frame(w.PRIORITY, 0, 1, bytes(4)), w.FRAME_SIZE_ERROR),
    "frame over 16384 bytes": (w.frame(w.DATA, 0, 1, bytes(16_385)), w.FRAME_SIZE_ERROR),
    "data on stream 0": (w.frame(w.DATA, 0, 0, b"x"), w.PROTOCOL_ERROR),
    "headers on stream 0": (w.frame(w.HEADERS, w.END_HEADERS, 0, b"\x83"), w.PROTOCOL_ERROR),
    "data on an idle stream": (w.frame(w.DATA, 0, 5, b"x"), w.PROTOCOL_ERROR),
    "window update on an idle stream": (w.window_update(5, 1), w.PROTOCOL_ERROR),
    "rst_stream on an idle stream": (w.rst_stream(5, w.CANCEL), w.PROTOCOL_ERROR),
    "continuation without headers": (
        w.frame(w.CONTINUATION, w.END_HEADERS, 1, b""),
        w.PROTOCOL_ERROR,
    ),
    "undecodable header block": (
        w.frame(w.HEADERS, w.END_HEADERS, 1, b"\xff" * 5),
        w.COMPRESSION_ERROR,
    ),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
async def test_a_malformed_frame_ends_the_connection_with_its_error(
    served: Served, case: str
) -> None:
    wire, code = MALFORMED[case]
    frames = await attack(served.port, wire)
    assert goaway(frames)[1] == code
    await serving(served.port)


async def test_a_stream_window_pushed_past_2_31_ends_with_flow_control_error(
    served: Served,
) -> None:
    client = await Raw.connect(served.port)
    await client.send(client.headers(1) + w.window_update(1, w.MAX_WINDOW))
    # a connection error: RFC 9113 §5.4 lets an endpoint treat a stream error as one
    assert goaway(await client.frames())[1] == w.FLOW_CONTROL_ERROR
    await serving(served.port)


async def test_zero_window_readers_hold_streams_only_up_to_the_stream_limit(
    served: Served,
) -> None:
    """A client that grants no window gets no DATA: its calls cannot finish and keep their
    streams open. The stream over the advertised limit ends the connection."""
    client = await Raw.connect(served.port, {w.SETTINGS_INITIAL_WINDOW_SIZE: 0})
    limit = h2limits.MAX_CONCURRENT_STREAMS
    wire = b"".join(client.check(2 * i + 1) for i in range(limit + 1))
    with cost() as c:
        await client.send(wire)
        frames = await client.frames()
    assert not [f for f in frames if f[0] == w.DATA]
    last, code, _ = goaway(frames)
    assert (last, code) == (2 * limit - 1, w.PROTOCOL_ERROR)  # the last stream it took
    assert c.cpu < 10.0 and c.rss < 128 << 20
    await serving(served.port)


async def test_open_ext_proc_streams_beyond_the_limit_are_refused_at_a_bounded_cost(
    served: Served,
) -> None:
    client = await Raw.connect(served.port)
    limit = h2limits.MAX_CONCURRENT_STREAMS
    with cost() as c:
        await client.send(b"".join(client.headers(2 * i + 1, PROCESS) for i in range(limit)))
        await asyncio.sleep(0.2)
        (conn,) = served.server._conns
        assert len(conn.streams) == limit
        await client.send(client.headers(2 * limit + 1, PROCESS))
        last, code, _ = goaway(await client.frames())
    assert (last, code) == (2 * limit - 1, w.PROTOCOL_ERROR)  # the last stream it took
    assert c.cpu < 10.0 and c.rss < 128 << 20
    await serving(served.port)


async def test_a_client_that_never_reads_stops_being_read_and_is_dropped(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(h2limits, "KEEPALIVE_TIME", 1.0)
    monkeypatch.setattr(h2limits, "KEEPALIVE_TIMEOUT", 1.0)
    monkeypatch.setattr(h2limits, "WRITE_HIGH_WATER", 64 << 10)  # reached in a second
    monkeypatch.setattr(h2limits, "WRITE_LOW_WATER", 16 << 10)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)  # a slow network
    sock.connect(("127.0.0.1", served.port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock)
    client = Raw(reader, writer)
    # the largest windows: flow control never holds the server back, only the socket does
    window = w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
    grant = w.window_update(0, w.MAX_WINDOW - w.DEFAULT_WINDOW)
    await client.send(w.PREFACE + window + w.frame(w.SETTINGS, w.ACK, 0) + grant)
    await asyncio.sleep(0.1)
    (conn,) = served.server._conns
    server_sock = conn._transport.get_extra_info("socket")
    server_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 10)
    transport = conn._transport
    assert transport is not None
    with cost() as c:
        # health calls at a pace the server keeps up with (a read must hold fewer calls than
        # the stream limit: they are answered at its end), never reading the answers
        sid = 1
        async with asyncio.timeout(10):
            while transport.is_reading():  # until the server stops reading
                writer.write(b"".join(client.check(sid + 2 * i) for i in range(100)))
                sid += 200
                await asyncio.sleep(0.02)
        assert not transport.is_closing()
        peak = transport.get_write_buffer_size()
        await asyncio.sleep(0.2)
        assert not transport.is_reading()  # what the client sends now waits in the socket
        assert transport.get_write_buffer_size() <= peak  # and makes nothing more to send
        async with asyncio.timeout(10):
            while served.server._conns:  # the keepalive drops it
                await asyncio.sleep(0.05)
    assert h2limits.WRITE_HIGH_WATER < peak < h2limits.WRITE_HIGH_WATER + (2 << 20)
    assert c.cpu < 10.0 and c.rss < 128 << 20
    writer.close()
    await serving(served.port)
