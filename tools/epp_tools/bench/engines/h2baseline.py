"""The hand-written HTTP/2 framing the ext_proc server ran on before it moved to libnghttp2
(``epp.server.h2conn``), kept as it was as the baseline of ``epp bench engines``; nothing serves
it. Its flaws stay too: its SETTINGS parser took a payload that is not a multiple of 6, a
WINDOW_UPDATE could push a window past 2^31-1, it advertised no stream limit, and it had no
reset, PING or keepalive limits.

A gRPC call is one HTTP/2 stream. Each complete length-prefixed message goes to the stream's
``Call`` (``on_message``), the client's END_STREAM to ``on_half_close``, a peer reset or a lost
connection to ``on_reset``. The call answers through ``send`` (one message) and ``finish``
(status trailers; the stream is reset with NO_ERROR if the client is still sending, as RFC 9113
§8.1 asks).

Everything the frames of one read produce goes out in one ``transport.write``. A stream that
ends lets go of its call, so that a request's objects are freed by reference counting. Flow control:
the server grants the largest windows HTTP/2 allows (it bounds memory by
``--grpc-max-recv-msg-size`` per message instead) and keeps the peer's send windows exactly,
queueing what does not fit until the peer's WINDOW_UPDATE. Pings are answered, the peer's
SETTINGS applied and acknowledged, header blocks decoded in order (CONTINUATION included) so the
HPACK table stays in step even for streams already closed. Header blocks it writes are HPACK
literals that never touch the dynamic table (RFC 7541 §6.2.2, "without indexing"; ``:status 200``
is static index 8), so they need no encoder state and are the same bytes on every connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable, Iterable
from typing import Any, Final, cast
from urllib.parse import quote

import hpack

from epp.server import h2wire as w
from epp.server.h2conn import Call, Router

log = logging.getLogger(__name__)

_U32 = struct.Struct(">I")
_WINDOW_REFILL = 1 << 30
_DRAIN_PING = b"epp-gone"


class H2Error(Exception):
    """A connection error: the connection ends with GOAWAY carrying ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _int(value: int, prefix_bits: int, first: int) -> bytes:
    """HPACK integer (RFC 7541 §5.1) with ``first`` holding the representation's high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode("latin-1", "replace")
    return _int(len(raw), 7, 0x00) + raw


def literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 §6.2.2)."""
    return b"\x00" + _string(name) + _string(value)


RESPONSE_HEADERS: Final = b"\x88" + literal("content-type", "application/grpc")
"""``:status 200`` (static index 8) and ``content-type: application/grpc``."""


def status_block(code: int, message: str = "") -> bytes:
    """The trailers of a gRPC call: ``grpc-status`` and, when set, ``grpc-message``
    (percent-encoded as the gRPC HTTP/2 protocol says)."""
    block = literal("grpc-status", str(code))
    if message:
        block += literal("grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"))
    return block


class _Stream:
    __slots__ = (
        "call",
        "conn",
        "ended",
        "finished",
        "headers",
        "headers_sent",
        "inbox",
        "pending",
        "sid",
        "trailers",
        "window",
    )

    def __init__(self, conn: Connection, sid: int, window: int) -> None:
        self.conn = conn
        self.sid = sid
        self.window = window
        self.call: Call | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.inbox = bytearray()
        self.pending = bytearray()
        self.trailers: bytes | None = None
        self.headers_sent = False
        self.ended = False  # the client sent END_STREAM
        self.finished = False  # our trailers are written or queued

    def send(self, payload: bytes) -> None:
        if not self.finished:
            self.conn.send_data(self, w.grpc_message(payload))

    def finish(self, code: int, message: str = "") -> None:
        if not self.finished:
            self.finished = True
            self.conn.send_trailers(self, status_block(code, message))


class Connection(asyncio.Protocol):
    def __init__(self, route: Router, max_message: int, on_close: Callable[[Connection], None]):
        self._route = route
        self._max_message = max_message
        self._on_close = on_close
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface = False
        self._out: list[bytes] | None = None  # collecting while handling one read
        self._decoder = hpack.Decoder()
        self._block = bytearray()  # a header block awaiting CONTINUATION
        self._block_stream = 0
        self._block_end = False
        self.streams: dict[int, _Stream] = {}
        self._last_sid = 0
        self._peer_window = w.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self._peer_frame = w.DEFAULT_MAX_FRAME
        self._conn_window = w.DEFAULT_WINDOW
        self._received = 0
        self.goaway_sent = False  # draining: the first GOAWAY went out
        self._refusing = False  # the final GOAWAY went out: new streams are refused

    # ---- transport events -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        settings = w.settings_frame(
            {w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW, w.SETTINGS_ENABLE_PUSH: 0}
        )
        grant = w.window_update(0, w.MAX_WINDOW - w.DEFAULT_WINDOW)
        self._transport.write(settings + grant)

    def connection_lost(self, exc: Exception | None) -> None:
        streams, self.streams = self.streams, {}
        for st in streams.values():
            if st.call is not None and not st.finished:
                st.finished = True
                st.call.on_reset()
            st.call = None
        self._on_close(self)

    def data_received(self, data: bytes) -> None:
        self._out = []
        try:
            self._buf += data
            self._frames()
        except H2Error as err:
            log.warning("ext_proc HTTP/2 connection error: %s", err)
            self._out.append(w.goaway(self._last_sid, err.code, str(err).encode()[:200]))
            self._flush()
            assert self._transport is not None
            self._transport.close()
            return
        self._flush()

    def _flush(self) -> None:
        out, self._out = self._out, None
        if out and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def _write(self, data: bytes) -> None:
        if self._out is not None:
            self._out.append(data)
        elif self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def goaway(self) -> None:
        """Graceful shutdown in two steps, as gRPC servers do: a GOAWAY naming the highest
        stream id and a PING; once the PING is answered, every stream the peer opened before
        it saw the GOAWAY has arrived, and a second GOAWAY names the last one. Streams opened
        after that are refused; the open ones finish."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self._write(w.goaway(w.MAX_WINDOW, w.NO_ERROR) + w.frame(w.PING, 0, 0, _DRAIN_PING))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- frames in --------------------------------------------------------------------------

    def _frames(self) -> None:
        buf = self._buf
        pos = 0
        if not self._preface:
            if len(buf) < len(w.PREFACE):
                return
            if buf[: len(w.PREFACE)] != w.PREFACE:
                raise H2Error(w.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._preface = True
            pos = len(w.PREFACE)
        end = len(buf)
        while end - pos >= 9:
            hi, lo, ftype, flags, sid = w.FRAME_HEADER.unpack_from(buf, pos)
            length = (hi << 16) | lo
            if length > w.DEFAULT_MAX_FRAME:  # the largest frame we allow (SETTINGS default)
                raise H2Error(w.FRAME_SIZE_ERROR, f"a {length}-byte frame")
            if end - pos - 9 < length:
                break
            payload = bytes(buf[pos + 9 : pos + 9 + length])
            pos += 9 + length
            self._frame(ftype, flags, sid & 0x7FFFFFFF, payload)
        del buf[:pos]

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block_stream and ftype != w.CONTINUATION:
            raise H2Error(w.PROTOCOL_ERROR, "header block interrupted")
        if ftype == w.DATA:
            self._on_data(flags, sid, payload)
        elif ftype in (w.HEADERS, w.CONTINUATION):
            self._on_headers(ftype, flags, sid, payload)
        elif ftype == w.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif ftype == w.SETTINGS:
            self._on_settings(flags, payload)
        elif ftype == w.PING:
            if not flags & w.ACK:
                self._write(w.frame(w.PING, w.ACK, 0, payload))
            elif payload == _DRAIN_PING and not self._refusing:
                self._refusing = True
                self._write(w.goaway(self._last_sid, w.NO_ERROR))
        elif ftype == w.RST_STREAM:
            st = self.streams.pop(sid, None)
            if st is not None and st.call is not None and not st.finished:
                st.finished = True
                st.call.on_reset()
            if st is not None:
                st.call = None
        elif ftype == w.GOAWAY:
            self.goaway()
        # PRIORITY, PUSH_PROMISE (never from a client) and unknown types are ignored

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        self._received += len(payload)
        if self._received >= _WINDOW_REFILL:
            self._write(w.window_update(0, self._received))
            self._received = 0
        if flags & w.PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        st = self.streams.get(sid)
        if st is None or st.ended or st.finished:
            if st is not None and flags & w.END_STREAM:
                self._half_close(st)
            return  # a stream we already answered: its data is dropped
        inbox = st.inbox
        inbox += payload
        while len(inbox) >= 5 and not st.finished:
            compressed, size = w.MESSAGE_PREFIX.unpack_from(inbox, 0)
            if size > self._max_message:
                self._abort(
                    st, w.GRPC_RESOURCE_EXHAUSTED, f"message over {self._max_message} bytes"
                )
                return
            if len(inbox) < 5 + size:
                break
            message = bytes(inbox[5 : 5 + size])
            del inbox[: 5 + size]
            if compressed:
                self._abort(st, w.GRPC_UNIMPLEMENTED, "compressed messages are not accepted")
                return
            assert st.call is not None
            st.call.on_message(message)
        if flags & w.END_STREAM:
            self._half_close(st)

    def _half_close(self, st: _Stream) -> None:
        st.ended = True
        if st.finished:
            if st.trailers is None:  # else _end drops it once the queued data is out
                self._forget(st)
        elif st.call is not None:
            st.call.on_half_close()

    def _on_headers(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == w.HEADERS:
            if flags & w.PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & w.PRIORITY_FLAG:
                payload = payload[5:]
            self._block_stream = sid
            self._block_end = bool(flags & w.END_STREAM)
            self._block = bytearray(payload)
        elif sid != self._block_stream:
            raise H2Error(w.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        else:
            self._block += payload
        if len(self._block) > 1 << 20:
            raise H2Error(w.PROTOCOL_ERROR, "header block over 1 MiB")
        if not flags & w.END_HEADERS:
            return
        self._block_stream = 0
        try:
            headers = self._decoder.decode(bytes(self._block), raw=True)
        except Exception as exc:
            raise H2Error(w.COMPRESSION_ERROR, f"bad header block: {exc}") from None
        self._header_block(sid, headers, self._block_end)

    def _header_block(self, sid: int, headers: Iterable[Any], end: bool) -> None:
        known = self.streams.get(sid)
        if known is not None:  # trailers
            if end:
                self._half_close(known)
            return
        if sid <= self._last_sid or sid % 2 == 0:
            return  # a stream already closed (or not the client's): its headers only kept HPACK
        self._last_sid = sid
        st = _Stream(self, sid, self._peer_window)
        if self._refusing:
            self._write(w.rst_stream(sid, w.REFUSED_STREAM))
            return
        self.streams[sid] = st
        st.headers = list(headers)
        path = next((str(v, "latin-1") for k, v in headers if k == b":path"), "")
        st.ended = end
        st.call = self._route(path, st)
        if st.call is None:
            st.finish(w.GRPC_UNIMPLEMENTED, f"unknown method {path}")
        elif end:
            st.call.on_half_close()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            self._conn_window += increment
            for st in list(self.streams.values()):
                if st.pending:
                    self._drain(st)
        elif (one := self.streams.get(sid)) is not None:
            one.window += increment
            self._drain(one)

    def _on_settings(self, flags: int, payload: bytes) -> None:
        if flags & w.ACK:
            return
        for i in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == w.SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._peer_window
                self._peer_window = value
                for st in self.streams.values():
                    st.window += delta
            elif key == w.SETTINGS_MAX_FRAME_SIZE:
                self._peer_frame = value
        self._write(w.frame(w.SETTINGS, w.ACK, 0))

    # ---- frames out -------------------------------------------------------------------------

    def send_data(self, st: _Stream, data: bytes) -> None:
        if not st.headers_sent:
            st.headers_sent = True
            self._write(w.frame(w.HEADERS, w.END_HEADERS, st.sid, RESPONSE_HEADERS))
        n = len(data)
        if not st.pending and n <= st.window and n <= self._conn_window and n <= self._peer_frame:
            st.window -= n
            self._conn_window -= n
            self._write(w.frame_header(w.DATA, 0, st.sid, n) + data)
            return
        st.pending += data
        self._drain(st)

    def send_trailers(self, st: _Stream, block: bytes) -> None:
        if not st.headers_sent:  # trailers-only response
            block = RESPONSE_HEADERS + block
        st.trailers = block
        if not st.pending:
            self._end(st)

    def _drain(self, st: _Stream) -> None:
        pending = st.pending
        while pending:
            n = min(len(pending), st.window, self._conn_window, self._peer_frame)
            if n <= 0:
                return
            chunk = bytes(pending[:n])
            del pending[:n]
            st.window -= n
            self._conn_window -= n
            self._write(w.frame_header(w.DATA, 0, st.sid, n) + chunk)
        if st.trailers is not None:
            self._end(st)

    def _end(self, st: _Stream) -> None:
        assert st.trailers is not None
        self._write(w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, st.sid, st.trailers))
        st.trailers = None
        if not st.ended:  # the client is still sending: tell it to stop
            self._write(w.rst_stream(st.sid, w.NO_ERROR))
        self._forget(st)

    def _forget(self, st: _Stream) -> None:
        """Drop a stream that has ended. The call and the stream refer to each other (``io``
        and ``call``); cutting that here lets reference counting free a request's objects at
        once instead of leaving a cycle per request to the cyclic garbage collector, whose
        full collections then take hundreds of milliseconds at a few hundred requests a
        second (``epp bench rate``)."""
        self.streams.pop(st.sid, None)
        st.call = None

    def _abort(self, st: _Stream, code: int, message: str) -> None:
        """End a call the connection cannot carry on (the call hears a reset)."""
        call = st.call  # finishing may already forget the stream
        st.finish(code, message)
        if call is not None:
            call.on_reset()
