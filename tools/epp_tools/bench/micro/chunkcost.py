"""``epp bench micro`` row: the EPP's CPU per streamed response chunk inside the process,
without a socket or the event loop between chunks; and the same harness for ``epp bench
engines`` with any HTTP/2 engine under the calls.

A whole EPP (``App``, the built-in default config, the endpoints of ``epp_tools.bench.micro.wire``)
serves ext_proc streams through a connection (``epp.server.h2conn.Connection`` unless told
otherwise) and ``epp.server.h2.ExtProcCall`` with a transport that only counts bytes, fed by frames
a gRPC client would send:

* per chunk: one stream's request headers and body (routed), the response headers, then
  ``chunks`` DATA frames of one 100-byte SSE chunk each, fed one per ``data_received`` call as
  single reads would bring them;
* per request: ``requests`` streams one after another, each the request headers and body
  (routed: the routing task is awaited), the response headers and one chunk with end of
  stream, the client's END_STREAM on that last frame.

* per long request: ``requests`` agents' turns of 195,000 tokens (all but the last 1,300 shared,
  the context sent once before), each as Envoy sends it: the request headers, the ~780 KB body
  in two chunks (all but the last 65,280 bytes, then those) and an empty chunk with end of
  stream, in 16 KB DATA frames; then the response headers and one chunk with end of stream.

The process CPU around those calls is everything the EPP does but the socket read, the write
system call and the event loop's turn; the wire row's per-chunk figure minus this one is about
what those cost.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import hpack

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server import h2wire as w
from epp.server.context import ServerContext
from epp.server.h2 import PROCESS, ExtProcCall
from epp.server.h2conn import Connection, Router
from epp.server.misuse import MisuseLog
from epp_tools.bench.micro import wire

if TYPE_CHECKING:
    from epp.app import App

_ROUTE_TRIES = 100  # x 50 ms: the endpoints' file discovery has run by then


class Conn(Protocol):
    """What the harness needs of a connection (``epp.server.h2conn.Connection`` and the
    engines of ``epp bench engines``)."""

    streams: dict[int, Any]

    def connection_made(self, transport: Any) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


Factory = Callable[[Router, int, Callable[[Any], None]], Conn]


class CountingTransport:
    def __init__(self) -> None:
        self.written = 0
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        self.writes += 1

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass


class Client:
    """The frames of one gRPC client connection (its HPACK encoder has state)."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    @staticmethod
    def preface() -> bytes:
        """The client's preface, SETTINGS and window, and its ACK of the server's SETTINGS
        (which the server sent when the connection was made): until that ACK the server's
        streams keep the default 65,535-byte window, and a body past it is a FLOW_CONTROL_ERROR
        that ends the connection."""
        peer = w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
        ack = w.frame(w.SETTINGS, w.ACK, 0)
        return w.PREFACE + peer + ack + w.window_update(0, w.MAX_WINDOW - w.DEFAULT_WINDOW)

    def headers(self, sid: int, path: str = PROCESS) -> bytes:
        block = self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "epp"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        return w.frame(w.HEADERS, w.END_HEADERS, sid, block)

    @staticmethod
    def message(sid: int, payload: bytes, *, end: bool = False) -> bytes:
        return w.frame(w.DATA, w.END_STREAM if end else 0, sid, w.grpc_message(payload))


def connect(
    factory: Factory,
    route: Router,
    max_message: int = 1 << 24,
    transport: CountingTransport | None = None,
) -> Conn:
    conn = factory(route, max_message, lambda c: None)
    conn.connection_made(transport or CountingTransport())
    conn.data_received(Client.preface())
    return conn


def ext_proc(ctx: ServerContext) -> Router:
    misuse = MisuseLog(logging.getLogger(__name__), time.monotonic)
    return lambda path, io: ExtProcCall(io, ctx, misuse)


async def _settle(conn: Conn, sid: int) -> None:
    st = conn.streams.get(sid)
    call = st.call if st is not None else None
    if isinstance(call, ExtProcCall) and call.task is not None:
        await call.task


async def routed_stream(conn: Conn, client: Client, first: list[bytes]) -> int:
    """A stream id whose request was routed (retried while discovery has no endpoints yet)."""
    for attempt in range(_ROUTE_TRIES):
        sid = 2 * attempt + 1
        conn.data_received(client.headers(sid))
        for payload in first:
            conn.data_received(client.message(sid, payload))
        await _settle(conn, sid)
        if sid in conn.streams:
            return sid
        await asyncio.sleep(0.05)
    raise RuntimeError("the EPP routed no request")


class ChunkStream(NamedTuple):
    conn: Conn
    transport: CountingTransport  # the connection's
    sid: int  # a routed stream whose response headers and first chunk went in
    frames: list[bytes]  # more response chunks for it, one DATA frame each


async def chunk_stream(
    ctx: ServerContext, chunks: int, factory: Factory = Connection
) -> ChunkStream:
    """A connection with a stream ready for ``chunks`` streamed response chunks."""
    transport, client = CountingTransport(), Client()
    conn = connect(factory, ext_proc(ctx), transport=transport)
    msgs = [m.SerializeToString() for m in wire.stream_messages(chunks + 1)]
    sid = await routed_stream(conn, client, msgs[:2])
    conn.data_received(client.message(sid, msgs[2]))
    frames = [client.message(sid, m) for m in msgs[3 : 3 + chunks]]
    return ChunkStream(conn, transport, sid, frames)


async def per_chunk(ctx: ServerContext, chunks: int, factory: Factory = Connection) -> float:
    """µs of process CPU per streamed chunk (see the module docstring)."""
    conn, _, sid, frames = await chunk_stream(ctx, chunks, factory)
    t0 = time.process_time()
    for frame in frames:
        conn.data_received(frame)
    spent = time.process_time() - t0
    if sid not in conn.streams:
        raise RuntimeError("the stream ended before its chunks did")
    conn.connection_lost(None)
    return spent / chunks * 1e6


async def per_request(ctx: ServerContext, requests: int, factory: Factory = Connection) -> float:
    """µs of process CPU per request of one chunk (see the module docstring)."""
    conn, client = connect(factory, ext_proc(ctx)), Client()
    msgs = [m.SerializeToString() for m in wire.stream_messages(1)]
    await routed_stream(conn, client, msgs[:2])  # discovery has run
    t0 = time.process_time()
    for i in range(requests):
        sid = 1001 + 2 * i
        conn.data_received(client.headers(sid) + client.message(sid, msgs[0]))
        conn.data_received(client.message(sid, msgs[1]))
        await _settle(conn, sid)
        conn.data_received(client.message(sid, msgs[2]))
        conn.data_received(client.message(sid, msgs[3], end=True))
        if sid in conn.streams:
            raise RuntimeError("a request's stream did not end")
    spent = time.process_time() - t0
    conn.connection_lost(None)
    return spent / requests * 1e6


_ENVOY_TAIL = 65_280
"""Envoy's last body chunk before the empty one that ends a ~780 KB body (seen through Envoy
1.36 in full duplex: 714,886 + 65,280 bytes + 0)."""
_FRAME = 16_384  # the HTTP/2 default SETTINGS_MAX_FRAME_SIZE


def _long_request_frames(client: Client, sid: int, headers: bytes, body: bytes) -> list[bytes]:
    """One request's frames as Envoy sends them (see the module docstring)."""
    cut = max(0, len(body) - _ENVOY_TAIL)
    frames = [client.headers(sid) + client.message(sid, headers)]
    for piece, end in ((body[:cut], False), (body[cut:], False), (b"", True)):
        chunk = pb.ProcessingRequest(request_body=pb.HttpBody(body=piece, end_of_stream=end))
        framed = w.grpc_message(chunk.SerializeToString())
        frames += [w.frame(w.DATA, 0, sid, framed[i : i + _FRAME])
                   for i in range(0, len(framed), _FRAME)]  # fmt: skip
    return frames


async def per_long_request(
    ctx: ServerContext, requests: int, factory: Factory = Connection
) -> float:
    """µs of process CPU per 195,000-token agent's turn (see the module docstring)."""
    from epp_tools.bench.workloads.long import turn_bodies

    conn, client = connect(factory, ext_proc(ctx)), Client()
    msgs = [m.SerializeToString() for m in wire.stream_messages(1)]
    await routed_stream(conn, client, msgs[:2])  # discovery has run
    bodies = turn_bodies(requests + 1, 195_000, 1, 0)
    prepared = [
        _long_request_frames(client, 3001 + 2 * i, msgs[0], b) for i, b in enumerate(bodies)
    ]

    sent: CountingTransport = getattr(conn, "_transport")  # noqa: B009 (not in Conn)

    async def one(i: int) -> None:
        sid, before = 3001 + 2 * i, sent.written
        for frame in prepared[i]:
            conn.data_received(frame)
        await _settle(conn, sid)
        if sent.written - before < len(bodies[i]):  # routed: the body went back to Envoy
            raise RuntimeError("a long request was not routed")
        conn.data_received(client.message(sid, msgs[2]))
        conn.data_received(client.message(sid, msgs[3], end=True))
        if sid in conn.streams:
            raise RuntimeError("a long request's stream did not end")

    await one(0)  # the agent's context goes in, unmeasured
    t0 = time.process_time()
    for i in range(1, requests + 1):
        await one(i)
    spent = time.process_time() - t0
    conn.connection_lost(None)
    return spent / requests * 1e6


@asynccontextmanager
async def epp() -> AsyncIterator[ServerContext]:
    """A whole EPP with the wire benchmark's endpoints: its server context."""
    async with epp_app() as app:
        yield app.context


@asynccontextmanager
async def epp_app() -> AsyncIterator[App]:
    """A whole EPP with the wire benchmark's endpoints."""
    from epp.app import App
    from epp.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            grpc_port=0,
            grpc_health_port=0,
            metrics_port=0,
            bind_address="127.0.0.1",
            secure_serving=False,
            drain_timeout=0.0,
            config_text=wire.config(Path(tmp)),
            refresh_metrics_interval=10.0,
            response_body_sample_ratio=1.0,  # the work on a chunk the EPP reads
        )
        async with App(settings) as app:
            yield app


async def _measure(chunks: int) -> float:
    async with epp() as ctx:
        await per_chunk(ctx, chunks // 10)  # warm up
        return await per_chunk(ctx, chunks)


def measure(chunks: int = 20_000) -> float:
    """µs of process CPU per streamed chunk, in process (see the module docstring)."""
    return asyncio.run(_measure(chunks))


LONG_REQUESTS = 40


async def _measure_long(requests: int) -> float:
    async with epp() as ctx:
        return await per_long_request(ctx, requests)


def measure_long(requests: int = LONG_REQUESTS) -> float:
    """µs of process CPU per 195,000-token agent's turn, in process (module docstring)."""
    return asyncio.run(_measure_long(requests))
