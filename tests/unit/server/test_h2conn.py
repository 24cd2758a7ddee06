"""The HTTP/2 connection of the ext_proc server, driven frame by frame with a fake transport."""

from __future__ import annotations

import struct
from typing import Any

import hpack

from epp.server import h2wire as w
from epp.server.h2conn import CallIO, Connection


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def frames(self) -> list[tuple[int, int, int, bytes]]:
        out, buf = [], bytes(self.data)
        self.data.clear()
        while buf:
            hi, lo, ftype, flags, sid = w.FRAME_HEADER.unpack_from(buf, 0)
            n = (hi << 16) | lo
            out.append((ftype, flags, sid, buf[9 : 9 + n]))
            buf = buf[9 + n :]
        return out


class Echo:
    """Answers every message with itself; finishes OK at the client's half-close."""

    def __init__(self, io: CallIO, log: list[Any]) -> None:
        self.io = io
        self.log = log

    def on_message(self, data: bytes) -> None:
        self.log.append(("message", data))
        self.io.send(data)

    def on_half_close(self) -> None:
        self.log.append(("half_close",))
        self.io.finish(w.GRPC_OK)

    def on_reset(self) -> None:
        self.log.append(("reset",))


def connect() -> tuple[Connection, FakeTransport, list[Any]]:
    log: list[Any] = []
    conn = Connection(lambda path, io: Echo(io, log) if path == "/echo" else None, 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + w.settings_frame({}))
    t.frames()
    return conn, t, log


def headers(sid: int, path: str = "/echo", *, end: bool = False) -> bytes:
    block = hpack.Encoder().encode([(":method", "POST"), (":path", path)])
    flags = w.END_HEADERS | (w.END_STREAM if end else 0)
    return w.frame(w.HEADERS, flags, sid, block)


def data(sid: int, payload: bytes, *, end: bool = False) -> bytes:
    return w.frame(w.DATA, w.END_STREAM if end else 0, sid, payload)


def test_a_message_split_across_reads_and_frames_is_delivered_once_whole() -> None:
    conn, t, log = connect()
    msg = w.grpc_message(b"hello world")
    wire = headers(1) + data(1, msg[:7]) + data(1, msg[7:], end=True)
    for i in range(0, len(wire), 5):
        conn.data_received(wire[i : i + 5])
    assert log == [("message", b"hello world"), ("half_close",)]
    frames = t.frames()
    assert [f[0] for f in frames] == [w.HEADERS, w.DATA, w.HEADERS]
    assert frames[1][3] == msg
    trailers = hpack.Decoder().decode(frames[2][3])
    assert ("grpc-status", "0") in trailers and frames[2][1] & w.END_STREAM


def test_continuation_and_padding_are_handled_when_the_client_uses_them() -> None:
    conn, _t, log = connect()
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/echo")])
    padded = bytes([3]) + block[:4] + b"\0\0\0"
    wire = w.frame(w.HEADERS, w.PADDED, 1, padded)
    wire += w.frame(w.CONTINUATION, w.END_HEADERS, 1, block[4:])
    payload = w.grpc_message(b"x")
    wire += w.frame(w.DATA, w.PADDED | w.END_STREAM, 1, bytes([2]) + payload + b"\0\0")
    conn.data_received(wire)
    assert log == [("message", b"x"), ("half_close",)]


def test_unknown_method_answers_unimplemented_in_a_trailers_only_response() -> None:
    conn, t, _ = connect()
    conn.data_received(headers(1, "/nope", end=True))
    ((ftype, flags, sid, block),) = t.frames()
    fields = dict(hpack.Decoder().decode(block))
    assert (ftype, sid) == (w.HEADERS, 1) and flags & w.END_STREAM
    assert fields[":status"] == "200" and fields["grpc-status"] == str(w.GRPC_UNIMPLEMENTED)


def test_data_beyond_the_peer_window_waits_for_its_window_update() -> None:
    conn, t, _log = connect()
    conn.data_received(w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: 10}))
    conn.data_received(headers(1) + data(1, w.grpc_message(b"a" * 20), end=True))
    sent = [f for f in t.frames() if f[0] == w.DATA]
    assert sum(len(f[3]) for f in sent) == 10  # the window, and no trailers yet
    conn.data_received(w.window_update(1, 100))
    frames = t.frames()
    assert sum(len(f[3]) for f in frames if f[0] == w.DATA) == 15
    assert frames[-1][0] == w.HEADERS and frames[-1][1] & w.END_STREAM


def test_ping_is_acknowledged_and_settings_too() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678") + w.settings_frame({}))
    assert t.frames() == [(w.PING, w.ACK, 0, b"12345678"), (w.SETTINGS, w.ACK, 0, b"")]


def test_peer_reset_and_lost_connection_reset_the_open_calls() -> None:
    conn, _t, log = connect()
    conn.data_received(headers(1) + headers(3))
    conn.data_received(w.rst_stream(1, w.CANCEL))
    assert log == [("reset",)]
    conn.connection_lost(None)
    assert log == [("reset",), ("reset",)]


def test_an_oversized_message_ends_the_call_with_resource_exhausted() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, struct.pack(">BI", 0, 5000)))
    frames = t.frames()
    fields = dict(hpack.Decoder().decode(frames[0][3]))
    assert fields["grpc-status"] == str(w.GRPC_RESOURCE_EXHAUSTED)
    assert frames[1][0] == w.RST_STREAM and log == [("reset",)]


def test_a_bad_preface_ends_the_connection_with_goaway() -> None:
    log: list[Any] = []
    conn = Connection(lambda path, io: None, 1000, log.append)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    t.frames()
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    ((ftype, _, _, payload),) = t.frames()
    assert ftype == w.GOAWAY and struct.unpack(">II", payload[:8])[1] == w.PROTOCOL_ERROR
    assert t.closed


def test_goaway_refuses_new_streams_only_after_its_ping_and_lets_open_ones_end() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1))
    conn.goaway()
    (first, ping) = t.frames()
    assert first[0] == w.GOAWAY and struct.unpack(">I", first[3][:4])[0] == w.MAX_WINDOW
    conn.data_received(headers(3))  # sent before the client saw the GOAWAY: still served
    assert t.frames() == []
    conn.data_received(w.frame(w.PING, w.ACK, 0, ping[3]))
    ((ftype, _, _, payload),) = t.frames()
    assert ftype == w.GOAWAY and struct.unpack(">I", payload[:4])[0] == 3
    conn.data_received(headers(5))
    ((ftype, _, sid, _),) = t.frames()
    assert (ftype, sid) == (w.RST_STREAM, 5)
    conn.data_received(data(1, b"", end=True) + data(3, b"", end=True))
    assert log == [("half_close",), ("half_close",)] and not conn.streams
