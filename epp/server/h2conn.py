"""One HTTP/2 connection of the ext_proc server (``epp.server.h2``), on libnghttp2 (``ngh2``,
the engine of curl and nghttpx): it validates every frame, decodes HPACK, keeps stream states
and windows, and answers a peer's error with the RST_STREAM or GOAWAY RFC 9113 names (a window
past 2^31-1 is a connection FLOW_CONTROL_ERROR even when it is a stream's, as §5.4 allows).
Limits and why: ``epp.server.h2limits``; why this engine: ``epp bench engines``.

A gRPC call is one stream: each whole length-prefixed message goes to its ``Call``
(``on_message``), the client's END_STREAM or trailers to ``on_half_close``, a reset (the
peer's, the engine's, a lost connection) to ``on_reset``. The call answers through its
``CallIO``: ``send``, ``finish`` (trailers; a client still sending then gets RST_STREAM
NO_ERROR once they are out, RFC 9113 §8.1) and ``headers``. What one read produces goes out
in one write. A stream that ends lets go of its call (reference counting frees it).

Graceful shutdown (``goaway``), as gRPC servers do it: a GOAWAY naming the highest stream id
and a PING; once the PING is answered, every stream the peer opened before it saw the GOAWAY
has arrived, and a final GOAWAY names the last one. The engine ignores streams opened after it
(the client knows they were not processed); the open ones finish.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import ngh2

from epp.server import h2limits as limits
from epp.server import h2wire as w
from epp.server.h2limits import Keepalive, PingPolicy

log = logging.getLogger(__name__)

_now = time.monotonic  # the event loop's clock
_PREFIX = w.MESSAGE_PREFIX.unpack_from
_PACK_PREFIX = w.MESSAGE_PREFIX.pack
_DATA = ngh2.DataReceived
_DRAIN_PING = b"epp-gone"
_KEEPALIVE_PING = b"epp-kal?"


class Call(Protocol):
    def on_message(self, data: bytes) -> None: ...
    def on_half_close(self) -> None: ...
    def on_reset(self) -> None: ...


class CallIO(Protocol):
    """What a call answers through, and the request it answers."""

    @property
    def headers(self) -> Sequence[tuple[bytes, bytes]]:
        """The request's header fields, in order, (name, value) byte pairs (``:path`` too)."""
        ...

    def send(self, payload: bytes) -> None: ...
    def finish(self, code: int, message: str = "") -> None: ...


Router = Callable[[str, CallIO], Call | None]
"""Path → the call serving it (``None``: UNIMPLEMENTED)."""


class _Stream:
    __slots__ = ("call", "conn", "ended", "finished", "headers", "headers_sent", "inbox", "sid")

    def __init__(self, conn: Connection, sid: int, headers: Sequence[tuple[bytes, bytes]]):
        self.conn = conn
        self.sid = sid
        self.headers = headers
        self.call: Call | None = None
        self.inbox = bytearray()
        self.headers_sent = False
        self.ended = False  # the client sent END_STREAM
        self.finished = False  # our trailers are submitted

    def send(self, payload: bytes) -> None:
        if not self.finished:  # ``w.grpc_message`` inlined: one call per reply, per token
            self.conn.send_message(self, _PACK_PREFIX(0, len(payload)) + payload)

    def finish(self, code: int, message: str = "") -> None:
        if not self.finished:
            self.finished = True
            self.conn.send_trailers(self, w.status_headers(code, message))


class Connection(asyncio.Protocol):
    def __init__(self, route: Router, max_message: int, on_close: Callable[[Connection], None]):
        self._route = route
        self._max_message = max_message
        self._on_close = on_close
        self._h2 = ngh2.Connection(ngh2.Role.SERVER, limits.CONFIG)
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.streams: dict[int, _Stream] = {}
        self._to_reset: list[int] = []  # finished before the client ended: reset once sent
        self._last_sid = 0
        self._reading = False  # handling a read: one write at its end
        self._flush_soon = False
        self._dead = False  # the engine failed or the connection is ending
        self.goaway_sent = False  # draining: the first GOAWAY went out
        self._final_goaway = False
        self._keepalive = Keepalive(0.0)
        self._timer: asyncio.TimerHandle | None = None
        self._pings = PingPolicy()

    # ---- transport events -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(limits.WRITE_HIGH_WATER, limits.WRITE_LOW_WATER)
        self._loop = asyncio.get_running_loop()
        self._keepalive = Keepalive(_now())
        self._h2.initiate_connection(limits.SETTINGS)
        self._h2.set_local_window_size(w.MAX_WINDOW)
        self._flush()
        self._timer = self._loop.call_later(limits.KEEPALIVE_TIME, self._check_alive)

    def connection_lost(self, exc: Exception | None) -> None:
        self._dead = True
        if self._timer is not None:
            self._timer.cancel()
        streams, self.streams = self.streams, {}
        for st in streams.values():
            self._reset_call(st)
        self._on_close(self)

    def pause_writing(self) -> None:
        cast(asyncio.Transport, self._transport).pause_reading()

    def resume_writing(self) -> None:
        if not self._dead:
            cast(asyncio.Transport, self._transport).resume_reading()

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        self._keepalive.last_read = _now()
        self._reading = True
        try:
            self._h2.receive_data(data)
        except ngh2.NGH2Error as err:  # the engine is unusable after it raised
            self._fail(err)
            return
        try:
            self._events(self._h2.events())
        finally:
            self._reading = False
        self._flush()

    def goaway(self) -> None:
        """Start the graceful shutdown described in the module docstring."""
        if not self.goaway_sent and not self._dead:
            try:
                self._h2.send_shutdown_notice()
                self._h2.ping(_DRAIN_PING)
            except ngh2.NGH2Error:
                return  # the connection is ending already (the client's GOAWAY, an error)
            self.goaway_sent = True
            if not self._reading:
                self._flush()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- events in --------------------------------------------------------------------------

    def _events(self, events: list[ngh2.Event]) -> None:
        for ev in events:
            if type(ev) is _DATA:  # most events: a message
                self._on_data(ev.stream_id, ev.data, ev.end_stream)
            elif isinstance(ev, ngh2.RequestReceived):
                self._on_request(ev.stream_id, ev.headers, ev.end_stream)
            elif isinstance(ev, ngh2.StreamClosed):
                st = self.streams.pop(ev.stream_id, None)
                if st is not None:
                    self._reset_call(st)
            elif isinstance(ev, ngh2.TrailersReceived):
                if (st := self.streams.get(ev.stream_id)) is not None:
                    self._half_close(st)
            elif isinstance(ev, ngh2.PingReceived):
                self._on_ping()
            elif isinstance(ev, ngh2.PingAcknowledged):
                self._on_ping_ack(ev.opaque_data)
            # the rest (StreamReset before a StreamClosed, SETTINGS, WINDOW_UPDATE, PRIORITY,
            # the client's GOAWAY) is the engine's own business

    def _on_request(self, sid: int, headers: Sequence[tuple[bytes, bytes]], end: bool) -> None:
        self._last_sid = sid
        st = _Stream(self, sid, headers)
        self.streams[sid] = st
        path = next((str(v, "latin-1") for k, v in headers if k == b":path"), "")
        st.ended = end
        st.call = self._route(path, st)
        if st.call is None:
            st.finish(w.GRPC_UNIMPLEMENTED, f"unknown method {path}")
        elif end:
            st.call.on_half_close()

    def _on_data(self, sid: int, data: bytes, end: bool) -> None:
        st = self.streams.get(sid)
        if st is None:
            return  # a stream already answered: its data is dropped
        if data and not st.finished:
            inbox = st.inbox
            if not inbox and len(data) >= 5:  # the usual case: a frame holding one message
                compressed, size = _PREFIX(data)
                if len(data) == size + 5 and not compressed and size <= self._max_message:
                    assert st.call is not None
                    st.call.on_message(data[5:])
                    if end:
                        self._half_close(st)
                    return
            if inbox:
                inbox += data
                self._messages(st, inbox)
            else:  # whole messages: no copy into the inbox
                rest = self._messages(st, data)
                if rest and not st.finished:
                    inbox += rest
        if end:
            self._half_close(st)

    def _messages(self, st: _Stream, buf: bytes | bytearray) -> bytes | bytearray:
        """Hand every whole message in ``buf`` to the call; what is left over (an inbox is
        trimmed in place)."""
        pos, size_of = 0, len(buf)
        while size_of - pos >= 5 and not st.finished:
            compressed, size = w.MESSAGE_PREFIX.unpack_from(buf, pos)
            if size > self._max_message:
                too_large = f"message over {self._max_message} bytes"
                self._abort(st, w.GRPC_RESOURCE_EXHAUSTED, too_large)
                return b""
            if size_of - pos - 5 < size:
                break
            message = bytes(memoryview(buf)[pos + 5 : pos + 5 + size])  # one copy, not two
            pos += 5 + size
            if compressed:
                self._abort(st, w.GRPC_UNIMPLEMENTED, "compressed messages are not accepted")
                return b""
            assert st.call is not None
            st.call.on_message(message)
        if isinstance(buf, bytearray):
            del buf[:pos]
            return buf
        return buf[pos:]

    def _half_close(self, st: _Stream) -> None:
        st.ended = True
        if st.finished:
            self.streams.pop(st.sid, None)
        elif st.call is not None:
            st.call.on_half_close()

    def _on_ping_ack(self, opaque: bytes) -> None:
        if opaque == _DRAIN_PING and not self._final_goaway:
            self._final_goaway = True
            self._h2.send_goaway(w.NO_ERROR)

    def _on_ping(self) -> None:
        if self._pings.too_many(_now()):
            log.warning("ext_proc HTTP/2 client pings too often: closing its connection")
            self._h2.send_goaway(w.ENHANCE_YOUR_CALM, debug_data=b"too_many_pings")
            self._dead = True

    # ---- frames out -------------------------------------------------------------------------

    def send_message(self, st: _Stream, framed: bytes) -> None:
        try:
            if not st.headers_sent:
                st.headers_sent = True
                self._h2.send_response(st.sid, w.RESPONSE_HEADERS)
            self._h2.send_data(st.sid, framed)
        except ngh2.NGH2Error:
            return  # the stream or the connection is gone; its close event resets the call
        self._pings.sent = True
        if not self._reading:  # while a read is handled, its end writes
            self._write_soon()

    def send_trailers(self, st: _Stream, trailers: list[tuple[bytes, bytes]]) -> None:
        try:
            if st.headers_sent:
                self._h2.send_trailers(st.sid, trailers)
            else:  # trailers-only response
                self._h2.send_response(st.sid, w.RESPONSE_HEADERS + trailers, end_stream=True)
        except ngh2.NGH2Error:
            pass
        else:
            self._pings.sent = True
            if not st.ended:  # the client is still sending: tell it to stop, after the trailers
                self._to_reset.append(st.sid)
        self._forget(st)
        self._write_soon()

    def _forget(self, st: _Stream) -> None:
        """Drop a stream that has ended, cutting the call <-> stream cycle (``io``, ``call``) so
        that reference counting frees a request's objects at once: left to the cyclic garbage
        collector, they cost full collections of hundreds of milliseconds (``epp bench rate``)."""
        self.streams.pop(st.sid, None)
        st.call = None
        st.inbox.clear()

    def _reset_call(self, st: _Stream) -> None:  # the call hears a reset, once
        call, st.call = st.call, None
        if call is not None and not st.finished:
            st.finished = True
            call.on_reset()

    def _abort(self, st: _Stream, code: int, message: str) -> None:  # the call hears a reset
        call = st.call  # finishing forgets the stream
        st.finish(code, message)
        if call is not None:
            call.on_reset()

    def _write_soon(self) -> None:
        """Replies made by a task (not while a read is handled) go out at the next turn."""
        if not self._reading and not self._flush_soon and self._loop is not None:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        h2 = self._h2
        try:
            out = h2.data_to_send()
            if self._to_reset:
                out += self._resets()
            done = not h2.want_read and not h2.want_write  # the engine has finished
        except ngh2.NGH2Error as err:
            self._fail(err)
            return
        if out:
            transport.write(out)
        if self._dead or (done and not self.goaway_sent):
            # A GOAWAY for an error went out (the engine's or ours); a drain that we started
            # leaves the close to the client, who may read its last trailers and an EOF
            # together, or to ``H2Server.stop`` after its grace period.
            self._end(transport)

    def _resets(self) -> bytes:
        """RST_STREAM(NO_ERROR) for each finished stream whose trailers are out: submitted any
        earlier, the engine would drop the data and trailers still queued for it."""
        h2, waiting = self._h2, []
        for sid in self._to_reset:
            try:
                if h2.queued_body_size(sid):
                    waiting.append(sid)
                    continue
                h2.reset_stream(sid, w.NO_ERROR)
            except ngh2.NGH2Error:
                pass  # the client ended or reset it meanwhile
        self._to_reset = waiting
        return h2.data_to_send()

    def _fail(self, err: Exception) -> None:
        """The engine raised (a peer over one of its limits, a bad connection preface): it can
        no longer write, so the GOAWAY is ours."""
        log.warning("ext_proc HTTP/2 connection error: %s", err)
        self._dead = True
        self._reading = False
        calm = isinstance(err, ngh2.DenialOfServiceError)
        code = w.ENHANCE_YOUR_CALM if calm else w.PROTOCOL_ERROR
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(w.goaway(self._last_sid, code, str(err).encode()[:200]))
            self._end(self._transport)

    def _end(self, transport: asyncio.Transport) -> None:
        """Close after an error GOAWAY, still reading (and dropping) for ``CLOSE_LINGER`` after
        our FIN: closed with unread data, the socket would send a TCP reset that can destroy the
        GOAWAY unread. A client that does not read loses it after the keepalive timeout."""
        self._dead = True
        loop = self._loop
        if loop is None or not transport.can_write_eof():  # TLS: a plain close
            transport.close()
        else:
            transport.write_eof()
            loop.call_later(limits.CLOSE_LINGER, transport.close)
        if loop is not None:
            loop.call_later(limits.KEEPALIVE_TIMEOUT, transport.abort)

    # ---- keepalive --------------------------------------------------------------------------

    def _check_alive(self) -> None:
        assert self._loop is not None
        if self._dead:
            return
        action, wait = self._keepalive.due(_now())
        if action == Keepalive.CLOSE:
            log.warning("ext_proc HTTP/2 client silent after a keepalive PING: closing")
            self._dead = True
            if self._transport is not None:
                self._transport.abort()  # what it has not read is lost with it
            return
        if action == Keepalive.PING:
            self._h2.ping(_KEEPALIVE_PING)
            self._flush()
        self._timer = self._loop.call_later(wait, self._check_alive)
