"""gRPC over h2c on a pod's HTTP port: ``SniffingSite`` looks at a connection's first bytes and
hands an HTTP/2 connection (its preface, prior knowledge) to ``GrpcConnection`` and anything
else to aiohttp, so one port serves the OpenAI API, ``/metrics`` and gRPC alike.

``GrpcConnection`` (hyper's ``h2``) serves unary-request methods (the answers carry the pod's
``x-sim-pod`` and ``x-sim-role`` headers, as its HTTP answers do): a request's body is collected to
its end, its one gRPC message handed to the handler of its ``:path``, and each message the
handler sends goes out as a DATA frame (flow control honoured), then the trailers with
``grpc-status`` (0; 12 for an unknown method; 3 for a request that is not one uncompressed
message; a handler's ``GrpcError`` its own code and message).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from aiohttp import web

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_WINDOW_WAIT_S = 30.0  # a client that opens no flow-control window within this is given up
_MAX_REQUEST = 64 << 20

Send = Callable[[bytes], Awaitable[None]]
Handler = Callable[[bytes, Send], Awaitable[None]]
"""A method: the request message (protobuf bytes) and a function sending one response message."""


class GrpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Stream:
    path: str = ""
    body: bytearray = field(default_factory=bytearray)
    task: asyncio.Task[None] | None = None


def _frame(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def _unframe(body: bytes) -> bytes:
    if len(body) < 5 or body[0] != 0:
        raise GrpcError(3, "the request is not one uncompressed gRPC message")
    length = int.from_bytes(body[1:5], "big")
    if length != len(body) - 5:
        raise GrpcError(3, "the request is not one uncompressed gRPC message")
    return body[5:]


class GrpcConnection(asyncio.Protocol):
    """One HTTP/2 connection carrying gRPC calls."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        live: set[GrpcConnection],
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._conn = h2.connection.H2Connection(config=config)
        self._handlers = handlers
        self._live = live
        self._headers = [(":status", "200"), ("content-type", "application/grpc"), *headers]
        self._streams: dict[int, _Stream] = {}
        self._window = asyncio.Event()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._live.add(self)
        self._conn.initiate_connection()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        for stream in self._streams.values():
            if stream.task is not None:
                stream.task.cancel()
        self._streams.clear()
        self._window.set()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            self.close()
            return
        for event in events:
            self._on_event(event)
        self._flush()

    def _on_event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            path = dict(event.headers or ()).get(b":path", b"")
            self._streams[event.stream_id] = _Stream(path=path.decode("utf-8", "replace"))
        elif isinstance(event, h2.events.DataReceived):
            stream = self._streams.get(event.stream_id)
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if stream is not None and len(stream.body) < _MAX_REQUEST:
                stream.body += event.data
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream.task = asyncio.create_task(self._serve(event.stream_id, stream))
        elif isinstance(event, h2.events.StreamReset):
            stream = self._streams.pop(event.stream_id, None)
            if stream is not None and stream.task is not None:
                stream.task.cancel()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.close()

    async def _serve(self, stream_id: int, stream: _Stream) -> None:
        status, message = 0, ""
        self._conn.send_headers(stream_id, self._headers)
        self._flush()

        async def send(payload: bytes) -> None:
            await self._send_data(stream_id, _frame(payload))

        try:
            handler = self._handlers.get(stream.path)
            if handler is None:
                raise GrpcError(12, f"unknown method {stream.path}")
            await handler(_unframe(bytes(stream.body)), send)
        except GrpcError as err:
            status, message = err.code, err.message
        except (h2.exceptions.StreamClosedError, ConnectionError):
            return
        finally:
            self._streams.pop(stream_id, None)
        trailers = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._conn.send_headers(stream_id, trailers, end_stream=True)
            self._flush()

    async def _send_data(self, stream_id: int, data: bytes) -> None:
        view = memoryview(data)
        while view:  # each turn sends at least one byte, or waits (bounded) for a window
            size = min(
                self._conn.local_flow_control_window(stream_id), self._conn.max_outbound_frame_size
            )
            if size <= 0:
                self._window.clear()
                await asyncio.wait_for(self._window.wait(), _WINDOW_WAIT_S)
                if self._transport is None or self._transport.is_closing():
                    raise ConnectionError("connection closed")
                continue
            self._conn.send_data(stream_id, bytes(view[:size]))
            view = view[size:]
            self._flush()


class _Sniffer(asyncio.Protocol):
    """Waits for enough of a connection's first bytes to tell HTTP/2 from HTTP/1.1, then hands
    the connection to the protocol that speaks it."""

    def __init__(
        self, http1: Callable[[], asyncio.Protocol], h2c: Callable[[], asyncio.Protocol]
    ) -> None:
        self._factories = (http1, h2c)
        self._inner: asyncio.Protocol | None = None
        self._head = b""
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        self._head += data
        if len(self._head) < len(PREFACE) and PREFACE.startswith(self._head):
            return  # at most len(PREFACE) bytes are held
        http1, h2c = self._factories
        self._inner = h2c() if self._head.startswith(PREFACE) else http1()
        assert self._transport is not None
        self._inner.connection_made(self._transport)
        head, self._head = self._head, b""
        self._inner.data_received(head)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class SniffingSite(web.SockSite):
    """A ``SockSite`` whose connections are HTTP/1.1 (aiohttp) or gRPC over h2c (``handlers``,
    whose answers carry ``headers``); ``stop`` also closes the open HTTP/2 connections."""

    __slots__ = ("_handlers", "_headers", "_live")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: Any,
        handlers: Mapping[str, Handler],
        headers: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(runner, sock, backlog=1024)
        self._handlers = handlers
        self._headers = tuple(headers)
        self._live: set[GrpcConnection] = set()

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        handlers, live, headers = self._handlers, self._live, self._headers

        def factory() -> asyncio.Protocol:
            return _Sniffer(server, lambda: GrpcConnection(handlers, live, headers))

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(factory, sock=self._sock, backlog=self._backlog)

    async def stop(self) -> None:
        for conn in list(self._live):
            conn.close()
        await super().stop()
