"""``epp bench micro`` row: the EPP's CPU per streamed response chunk inside the process,
without a socket or the event loop between chunks.

A whole EPP (``App``, the built-in default config, the endpoints of ``epp.bench.wire``) serves
one ext_proc stream through ``epp.server.h2conn.Connection`` and ``epp.server.h2.ExtProcCall``
with a transport that only counts bytes: request headers and body (routed), the response
headers, then ``chunks`` DATA frames of one 100-byte SSE chunk each, fed one per
``data_received`` call as single reads would bring them. The process CPU around those calls per
chunk is everything the EPP does for a chunk but the socket read, the write system call and the
event loop's turn; the wire row's per-chunk figure minus this one is about what those cost.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path

import hpack

from epp.bench import wire
from epp.server import h2wire as w
from epp.server.h2 import PROCESS, ExtProcCall
from epp.server.h2conn import Connection
from epp.server.misuse import MisuseLog

_ROUTE_TRIES = 100  # x 50 ms: the endpoints' file discovery has run by then


class _CountingTransport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def _open(conn: Connection, sid: int, first: list[bytes]) -> None:
    block = hpack.Encoder().encode([(":method", "POST"), (":path", PROCESS)])
    conn.data_received(w.frame(w.HEADERS, w.END_HEADERS, sid, block))
    for payload in first:
        conn.data_received(w.frame(w.DATA, 0, sid, w.grpc_message(payload)))


async def _routed_stream(conn: Connection, first: list[bytes]) -> int:
    """A stream id whose request was routed (retried while discovery has no endpoints yet)."""
    for attempt in range(_ROUTE_TRIES):
        sid = 2 * attempt + 1
        _open(conn, sid, first)
        st = conn.streams.get(sid)
        call = st.call if st is not None else None
        if isinstance(call, ExtProcCall) and call.task is not None:
            await call.task
        if sid in conn.streams:
            return sid
        await asyncio.sleep(0.05)
    raise RuntimeError("the EPP routed no request")


async def _per_chunk(ctx: object, chunks: int) -> float:
    misuse = MisuseLog(logging.getLogger(__name__), time.monotonic)
    conn = Connection(lambda path, io: ExtProcCall(io, ctx, misuse), 1 << 24, lambda c: None)  # type: ignore[arg-type]
    conn.connection_made(_CountingTransport())  # type: ignore[arg-type]
    peer = w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
    conn.data_received(w.PREFACE + peer + w.window_update(0, w.MAX_WINDOW - w.DEFAULT_WINDOW))
    msgs = [m.SerializeToString() for m in wire.stream_messages(chunks + 1)]
    sid = await _routed_stream(conn, msgs[:2])
    conn.data_received(w.frame(w.DATA, 0, sid, w.grpc_message(msgs[2])))
    frames = [w.frame(w.DATA, 0, sid, w.grpc_message(m)) for m in msgs[3 : 3 + chunks]]
    t0 = time.process_time()
    for frame in frames:
        conn.data_received(frame)
    spent = time.process_time() - t0
    if sid not in conn.streams:
        raise RuntimeError("the stream ended before its chunks did")
    return spent / chunks * 1e6


async def _measure(chunks: int) -> float:
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
            await _per_chunk(app.context, chunks // 10)  # warm up
            return await _per_chunk(app.context, chunks)


def measure(chunks: int = 20_000) -> float:
    """µs of process CPU per streamed chunk, in process (see the module docstring)."""
    return asyncio.run(_measure(chunks))
