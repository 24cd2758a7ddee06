"""The ext_proc server's connection on hyper's ``h2`` (the pure-Python sans-I/O HTTP/2 engine),
for ``epp bench engines`` only: the calls of ``epp.server.h2`` driven through the same
``Call`` / ``CallIO`` interface as ``epp.server.h2conn.Connection``, with ``h2``'s default
validation of what the client sends. Enough of a server for the benchmark's traffic (windows
as large as HTTP/2 allows; what does not fit the peer's window is not sent), not for serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from epp.server import h2wire as w
from epp.server.h2conn import Call, Router

_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding=None)


class _Stream:
    __slots__ = ("call", "conn", "ended", "finished", "headers", "headers_sent", "inbox", "sid")

    def __init__(self, conn: HyperConnection, sid: int, headers: Sequence[tuple[bytes, bytes]]):
        self.conn, self.sid, self.headers = conn, sid, headers
        self.call: Call | None = None
        self.inbox = bytearray()
        self.headers_sent = self.ended = self.finished = False

    def send(self, payload: bytes) -> None:
        if self.finished:
            return
        h2c = self.conn.h2
        if not self.headers_sent:
            self.headers_sent = True
            h2c.send_headers(self.sid, w.RESPONSE_HEADERS)
        h2c.send_data(self.sid, w.grpc_message(payload))
        self.conn.flush_soon()

    def finish(self, code: int, message: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        h2c, trailers = self.conn.h2, w.status_headers(code, message)
        if not self.headers_sent:
            trailers = w.RESPONSE_HEADERS + trailers
        h2c.send_headers(self.sid, trailers, end_stream=True)
        if not self.ended:
            h2c.reset_stream(self.sid, w.NO_ERROR)
        self.conn.streams.pop(self.sid, None)
        self.call = None
        self.conn.flush_soon()


class HyperConnection(asyncio.Protocol):
    def __init__(
        self, route: Router, max_message: int, on_close: Callable[[HyperConnection], None]
    ):
        self._route, self._max_message, self._on_close = route, max_message, on_close
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self._transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self._reading = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: w.MAX_WINDOW},
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(w.MAX_WINDOW - w.DEFAULT_WINDOW)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        for st in self.streams.values():
            if st.call is not None:
                st.call.on_reset()
        self.streams.clear()
        self._on_close(self)

    def data_received(self, data: bytes) -> None:
        self._reading = True
        try:
            for ev in self.h2.receive_data(data):
                self._event(ev)
        finally:
            self._reading = False
        self.flush()

    def _event(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.DataReceived):
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            st = self.streams.get(ev.stream_id)
            if st is not None and ev.data:
                self._messages(st, ev.data)
        elif isinstance(ev, h2.events.RequestReceived):
            headers = ev.headers
            st = _Stream(self, ev.stream_id, headers)
            self.streams[st.sid] = st
            path = next((v.decode() for k, v in headers if k == b":path"), "")
            st.call = self._route(path, st)
            if st.call is None:
                st.finish(w.GRPC_UNIMPLEMENTED, f"unknown method {path}")
        elif isinstance(ev, h2.events.StreamEnded):
            st = self.streams.get(ev.stream_id)
            if st is not None:
                st.ended = True
                if st.call is not None:
                    st.call.on_half_close()
        elif isinstance(ev, h2.events.StreamReset):
            st = self.streams.pop(ev.stream_id, None)
            if st is not None and st.call is not None:
                st.finished = True
                st.call.on_reset()

    def _messages(self, st: _Stream, data: bytes) -> None:
        inbox = st.inbox
        inbox += data
        while len(inbox) >= 5 and not st.finished:
            compressed, size = w.MESSAGE_PREFIX.unpack_from(inbox, 0)
            if compressed or size > self._max_message:
                st.finish(w.GRPC_RESOURCE_EXHAUSTED, "message refused")
                return
            if len(inbox) < 5 + size:
                return
            message = bytes(inbox[5 : 5 + size])
            del inbox[: 5 + size]
            assert st.call is not None
            st.call.on_message(message)

    def flush_soon(self) -> None:
        if not self._reading:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(out)

    def goaway(self) -> None:
        self.h2.close_connection()
        self.flush()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
