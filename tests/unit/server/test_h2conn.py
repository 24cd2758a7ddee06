"""The HTTP/2 connection of the ext_proc server, driven frame by frame with a fake transport:
message framing, call lifecycles, trailers and resets, drain, the server's own GOAWAY when the
engine gives up, the client-ping policy, keepalive and write back-pressure."""

from __future__ import annotations

import asyncio
import gc
import struct
import weakref
from typing import Any

import hpack
import pytest

from epp.server import h2conn, h2limits
from epp.server import h2wire as w
from epp.server.h2conn import CallIO, Connection

Frame = tuple[int, int, int, bytes]


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.reading = True
        self.limits: tuple[int, int] | None = None
        self.decoder = hpack.Decoder()  # the server's HPACK encoder has state: decode all
        self.blocks: list[dict[str, str]] = []  # the header blocks of the last frames()

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def abort(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        self.limits = (high, low)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def frames(self) -> list[Frame]:
        out, buf = [], bytes(self.data)
        self.data.clear()
        self.blocks = []
        while buf:
            hi, lo, ftype, flags, sid = w.FRAME_HEADER.unpack_from(buf, 0)
            n = (hi << 16) | lo
            out.append((ftype, flags, sid, buf[9 : 9 + n]))
            if ftype == w.HEADERS:
                self.blocks.append(dict(self.decoder.decode(buf[9 : 9 + n])))
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


def connect(
    route: h2conn.Router | None = None,
    max_message: int = 1000,
    settings: dict[int, int] | None = None,
) -> tuple[Connection, FakeTransport, list[Any]]:
    log: list[Any] = []
    conn = Connection(
        route or (lambda path, io: Echo(io, log) if path == "/echo" else None), max_message, print
    )
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + w.settings_frame(settings or {}))
    t.frames()
    return conn, t, log


def request(path: str = "/echo", *extra: tuple[str, str]) -> bytes:
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "epp")]
    return bytes(hpack.Encoder().encode(fields + list(extra)))


def headers(sid: int, path: str = "/echo", *, end: bool = False) -> bytes:
    flags = w.END_HEADERS | (w.END_STREAM if end else 0)
    return w.frame(w.HEADERS, flags, sid, request(path))


def data(sid: int, payload: bytes, *, end: bool = False) -> bytes:
    return w.frame(w.DATA, w.END_STREAM if end else 0, sid, payload)


def goaway_of(frames: list[Frame]) -> tuple[int, int, bytes]:
    """The last frame is a GOAWAY: its last stream id, error code and debug text."""
    ftype, _, _, payload = frames[-1]
    assert ftype == w.GOAWAY
    last, code = struct.unpack(">II", payload[:8])
    return last, code, payload[8:]


async def test_a_message_split_across_reads_and_frames_is_delivered_once_whole() -> None:
    conn, t, log = connect()
    msg = w.grpc_message(b"hello world")
    wire = headers(1) + data(1, msg[:7]) + data(1, msg[7:], end=True)
    for i in range(0, len(wire), 5):
        conn.data_received(wire[i : i + 5])
    assert log == [("message", b"hello world"), ("half_close",)]
    frames = t.frames()
    assert [f[0] for f in frames] == [w.HEADERS, w.DATA, w.HEADERS]
    assert frames[1][3] == msg
    assert t.blocks == [
        {":status": "200", "content-type": "application/grpc"},
        {"grpc-status": "0"},
    ]
    assert frames[2][1] & w.END_STREAM
    assert not conn.streams


async def test_two_messages_in_one_frame_and_a_read_ending_inside_a_frame() -> None:
    conn, _t, log = connect()
    both = w.grpc_message(b"first") + w.grpc_message(b"second!")
    third = data(1, w.grpc_message(b"third"), end=True)
    conn.data_received(headers(1) + data(1, both) + third[:12])
    assert log == [("message", b"first"), ("message", b"second!")]
    conn.data_received(third[12:])
    assert log[2:] == [("message", b"third"), ("half_close",)]


async def test_a_frame_ending_inside_a_message_keeps_the_rest_for_the_next() -> None:
    conn, _t, log = connect()
    one, two = w.grpc_message(b"one"), w.grpc_message(b"two" * 10)
    conn.data_received(headers(1) + data(1, one + two[:4]))  # a prefix cut short
    conn.data_received(data(1, two[4:9]))
    assert log == [("message", b"one")]
    conn.data_received(data(1, two[9:], end=True))
    assert log == [("message", b"one"), ("message", b"two" * 10), ("half_close",)]


async def test_continuation_and_padding_are_handled_when_the_client_uses_them() -> None:
    conn, _t, log = connect()
    block = request()
    priority = struct.pack(">IB", 0, 15)
    flags = w.PADDED | w.PRIORITY_FLAG
    wire = w.frame(w.HEADERS, flags, 1, bytes([3]) + priority + block[:4] + b"\0\0\0")
    wire += w.frame(w.CONTINUATION, w.END_HEADERS, 1, block[4:])
    payload = w.grpc_message(b"x")
    wire += w.frame(w.DATA, w.PADDED | w.END_STREAM, 1, bytes([2]) + payload + b"\0\0")
    conn.data_received(wire)
    assert log == [("message", b"x"), ("half_close",)]


async def test_the_call_sees_the_request_headers() -> None:
    seen: list[Any] = []

    def route(path: str, io: CallIO) -> Echo:
        seen.append(list(io.headers))
        return Echo(io, [])

    conn, _t, _log = connect(route)
    block = request("/echo", ("authorization", "Bearer t0k"), ("x-b", "two"))
    conn.data_received(w.frame(w.HEADERS, w.END_HEADERS, 1, block))
    assert seen == [
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/echo"),
            (b":authority", b"epp"),
            (b"authorization", b"Bearer t0k"),
            (b"x-b", b"two"),
        ]
    ]


async def test_an_unknown_method_answers_unimplemented_then_resets_a_stream_still_sending() -> None:
    conn, t, _ = connect()
    conn.data_received(headers(1, "/nope", end=True))
    ((ftype, flags, sid, _),) = t.frames()  # the client had ended: no reset
    got = t.blocks[0]
    assert (ftype, sid) == (w.HEADERS, 1) and flags & w.END_STREAM
    assert got[":status"] == "200" and got["grpc-status"] == str(w.GRPC_UNIMPLEMENTED)
    assert got["grpc-message"] == "unknown method /nope"
    conn.data_received(headers(3, "/nope"))
    frames = t.frames()
    assert [f[:3] for f in frames] == [
        (w.HEADERS, w.END_HEADERS | w.END_STREAM, 3),
        (w.RST_STREAM, 0, 3),
    ]
    assert struct.unpack(">I", frames[1][3])[0] == w.NO_ERROR
    conn.data_received(data(3, b"late", end=True))  # dropped
    assert t.frames() == [] and not conn.streams


class OneShot:
    """Answers its first message and finishes at once, while the client may still send."""

    def __init__(self, io: CallIO) -> None:
        self.io = io

    def on_message(self, data: bytes) -> None:
        self.io.send(data)
        self.io.finish(w.GRPC_OK)

    def on_half_close(self) -> None:
        raise AssertionError("the call already finished")

    def on_reset(self) -> None:
        raise AssertionError("nothing to reset")


async def test_the_reset_after_early_trailers_waits_for_data_held_by_the_peer_window() -> None:
    small = {w.SETTINGS_INITIAL_WINDOW_SIZE: 10}
    conn, t, _ = connect(lambda path, io: OneShot(io), settings=small)
    message = w.grpc_message(b"a" * 20)
    conn.data_received(headers(1) + data(1, message))
    frames = t.frames()
    assert [f[0] for f in frames] == [w.HEADERS, w.DATA]  # 10 bytes; trailers and reset wait
    assert frames[1][3] == message[:10]
    conn.data_received(w.window_update(1, 100))
    frames = t.frames()
    assert [f[:3] for f in frames] == [
        (w.DATA, 0, 1),
        (w.HEADERS, w.END_HEADERS | w.END_STREAM, 1),
        (w.RST_STREAM, 0, 1),
    ]
    assert frames[0][3] == message[10:]


async def test_trailers_behind_data_end_without_reset_once_the_client_ended() -> None:
    small = {w.SETTINGS_INITIAL_WINDOW_SIZE: 10}
    conn, t, _ = connect(lambda path, io: OneShot(io), settings=small)
    conn.data_received(headers(1) + data(1, w.grpc_message(b"a" * 20)))
    t.frames()
    conn.data_received(data(1, b"", end=True))  # the client ends while they wait
    conn.data_received(w.window_update(1, 100))
    assert [f[0] for f in t.frames()] == [w.DATA, w.HEADERS]  # no reset: the client had ended


async def test_peer_reset_and_lost_connection_reset_the_open_calls() -> None:
    conn, _t, log = connect()
    conn.data_received(headers(1) + headers(3))
    conn.data_received(w.rst_stream(1, w.CANCEL))
    assert log == [("reset",)] and list(conn.streams) == [3]
    conn.connection_lost(None)
    assert log == [("reset",), ("reset",)] and not conn.streams


async def test_an_oversized_message_ends_the_call_with_resource_exhausted_from_its_prefix() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, w.grpc_message(b"m" * 1000), end=True))
    assert log == [("message", b"m" * 1000), ("half_close",)]  # at the limit: accepted
    t.frames()
    conn.data_received(headers(3) + data(3, struct.pack(">BI", 0, 1001)))  # the prefix alone
    frames = t.frames()
    got = t.blocks[0]
    assert got["grpc-status"] == str(w.GRPC_RESOURCE_EXHAUSTED)
    assert got["grpc-message"] == "message over 1000 bytes"
    assert frames[1][:3] == (w.RST_STREAM, 0, 3) and log[-1] == ("reset",)


async def test_a_compressed_message_is_unimplemented() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, b"\x01\x00\x00\x00\x01x"))
    frames = t.frames()
    got = t.blocks[0]
    assert got["grpc-status"] == str(w.GRPC_UNIMPLEMENTED)
    assert got["grpc-message"] == "compressed messages are not accepted"
    assert frames[1][:3] == (w.RST_STREAM, 0, 1) and log == [("reset",)]


async def test_client_trailers_half_close_the_call() -> None:
    conn, t, log = connect()
    block = hpack.Encoder().encode([("x-t", "1")])
    trailers = w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 1, block)
    conn.data_received(headers(1) + data(1, w.grpc_message(b"q")) + trailers)
    assert log == [("message", b"q"), ("half_close",)]
    assert [f[0] for f in t.frames()] == [w.HEADERS, w.DATA, w.HEADERS]


async def test_a_bad_preface_ends_the_connection_with_our_goaway() -> None:
    conn = Connection(lambda path, io: None, 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    t.frames()
    conn.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    _, code, text = goaway_of(t.frames())
    assert code == w.PROTOCOL_ERROR and b"bad client magic" in text and t.closed
    conn.data_received(w.PREFACE)  # nothing more is read
    assert t.frames() == []


async def test_an_engine_limit_ends_the_connection_with_enhance_your_calm() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1))
    flood = w.frame(w.HEADERS, 0, 3, request()[:2]) + w.frame(w.CONTINUATION, 0, 3, b"") * 50
    conn.data_received(flood)
    last, code, text = goaway_of(t.frames())
    assert (last, code) == (1, w.ENHANCE_YOUR_CALM) and b"CONTINUATION" in text and t.closed
    conn.connection_lost(None)
    assert log == [("reset",)]


async def test_a_protocol_error_gets_the_engines_goaway_and_the_connection_closes() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.SETTINGS, 0, 0, bytes(5)))  # not a multiple of 6
    _, code, _ = goaway_of(t.frames())
    assert code == w.FRAME_SIZE_ERROR and t.closed


async def test_goaway_refuses_new_streams_only_after_its_ping_and_lets_open_ones_end() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1))
    conn.goaway()
    assert conn.goaway_sent
    frames = t.frames()
    assert sorted(f[0] for f in frames) == [w.PING, w.GOAWAY]
    ping = next(f for f in frames if f[0] == w.PING)
    assert goaway_of([f for f in frames if f[0] == w.GOAWAY])[:2] == (w.MAX_WINDOW, w.NO_ERROR)
    conn.data_received(headers(3))  # sent before the client saw the GOAWAY: still served
    assert t.frames() == [] and list(conn.streams) == [1, 3]
    conn.data_received(w.frame(w.PING, w.ACK, 0, ping[3]) * 2)
    assert goaway_of(t.frames())[:2] == (3, w.NO_ERROR)  # the final GOAWAY, once
    conn.data_received(headers(5))  # after it: not served
    assert list(conn.streams) == [1, 3]
    conn.data_received(data(1, b"", end=True) + data(3, b"", end=True))
    assert log == [("half_close",), ("half_close",)] and not conn.streams
    assert not t.closed  # the client closes a drained connection


async def test_a_peer_goaway_lets_open_streams_end_then_the_server_closes() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + w.goaway(0, w.NO_ERROR))
    assert not t.closed
    conn.data_received(data(1, b"", end=True))
    assert log == [("half_close",)] and t.closed
    conn, t, _ = connect()
    conn.data_received(w.goaway(0, w.NO_ERROR))  # no stream open: closed at once
    assert t.closed
    conn.goaway()  # and a drain asked for later is a no-op
    assert not conn.goaway_sent


async def test_a_lost_connection_reports_itself_closed_and_skips_finished_calls() -> None:
    closed: list[Connection] = []
    log: list[Any] = []
    conn = Connection(lambda path, io: Echo(io, log), 1000, closed.append)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + w.settings_frame({}) + headers(1) + headers(3, end=True))
    assert log == [("half_close",)]  # stream 3 is answered and gone; stream 1 still open
    conn.connection_lost(None)
    assert log == [("half_close",), ("reset",)] and closed == [conn] and not conn.streams


async def test_nothing_is_written_to_a_closing_transport() -> None:
    conn, t, _ = connect()
    t.closed = True
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678"))
    conn.goaway()
    assert t.frames() == []


async def test_the_server_announces_its_limits_and_the_largest_windows() -> None:
    conn = Connection(lambda path, io: None, 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    (settings, grant) = t.frames()
    assert settings[:3] == (w.SETTINGS, 0, 0)
    pairs = [struct.unpack(">HI", settings[3][i : i + 6]) for i in range(0, len(settings[3]), 6)]
    assert dict(pairs) == {
        w.SETTINGS_MAX_CONCURRENT_STREAMS: h2limits.MAX_CONCURRENT_STREAMS,
        w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW,
        w.SETTINGS_MAX_HEADER_LIST_SIZE: h2limits.MAX_HEADER_LIST,
        w.SETTINGS_ENABLE_PUSH: 0,
    }
    assert grant[:3] == (w.WINDOW_UPDATE, 0, 0)
    assert struct.unpack(">I", grant[3])[0] == w.MAX_WINDOW - w.DEFAULT_WINDOW
    assert t.limits == (h2limits.WRITE_HIGH_WATER, h2limits.WRITE_LOW_WATER)
    conn.connection_lost(None)


class Twice(OneShot):
    def on_message(self, data: bytes) -> None:
        self.io.finish(w.GRPC_OK)
        self.io.send(b"too late")
        self.io.finish(w.GRPC_INTERNAL, "again")


async def test_a_call_finishes_once_and_sends_nothing_after() -> None:
    conn, t, _ = connect(lambda path, io: Twice(io))
    conn.data_received(headers(1) + data(1, w.grpc_message(b"x")))
    frames = [f for f in t.frames() if f[2] == 1]
    assert [f[0] for f in frames] == [w.HEADERS, w.RST_STREAM]
    assert t.blocks == [
        {
            ":status": "200",
            "content-type": "application/grpc",
            "grpc-status": "0",
        }
    ]


async def test_a_request_without_a_path_is_refused_by_the_engine() -> None:
    conn, t, log = connect()
    block = hpack.Encoder().encode([(":method", "POST"), (":scheme", "http"), (":authority", "a")])
    conn.data_received(w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 1, block))
    ((ftype, _, sid, payload),) = t.frames()
    assert (ftype, sid, struct.unpack(">I", payload)[0]) == (w.RST_STREAM, 1, w.PROTOCOL_ERROR)
    assert log == [] and not conn.streams


async def test_a_call_is_freed_without_the_cycle_collector_once_its_stream_ends() -> None:
    calls: list[weakref.ref[Echo]] = []

    def route(path: str, io: CallIO) -> Echo:
        call = Echo(io, [])
        calls.append(weakref.ref(call))
        return call

    conn, _t, _ = connect(route)
    gc.disable()
    try:
        conn.data_received(headers(1) + data(1, w.grpc_message(b"x"), end=True))  # ends OK
        conn.data_received(headers(3) + w.rst_stream(3, w.CANCEL))  # reset by the peer
        conn.data_received(headers(5) + data(5, struct.pack(">BI", 0, 5000)))  # aborted
        conn.data_received(headers(7))  # open when the connection is lost
        conn.connection_lost(None)
        assert len(calls) == 4
        assert [ref() for ref in calls] == [None, None, None, None]
    finally:
        gc.enable()


class Later:
    """Answers from a task, as a routed message does."""

    def __init__(self, io: CallIO) -> None:
        self.io = io

    def on_message(self, data: bytes) -> None:
        async def answer() -> None:
            self.io.send(data)
            self.io.send(data)
            self.io.finish(w.GRPC_OK)

        asyncio.get_running_loop().create_task(answer())

    def on_half_close(self) -> None:
        pass

    def on_reset(self) -> None:
        pass


async def test_an_answer_from_a_task_goes_out_in_one_write() -> None:
    conn, t, _ = connect(lambda path, io: Later(io))
    writes: list[bytes] = []
    t.write = writes.append  # type: ignore[method-assign]
    conn.data_received(headers(1) + data(1, w.grpc_message(b"r"), end=True))
    assert writes == []
    for _ in range(3):
        await asyncio.sleep(0)
    assert len(writes) == 1
    t.data += writes[0]
    frames = t.frames()
    assert [f[0] for f in frames] == [w.HEADERS, w.DATA, w.HEADERS]
    assert frames[1][3] == w.grpc_message(b"r") * 2


async def test_pings_are_answered_and_a_flood_ends_with_too_many_pings() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678"))
    assert t.frames() == [(w.PING, w.ACK, 0, b"12345678")]
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678") * 2)  # two strikes: still fine
    assert [f[0] for f in t.frames()] == [w.PING, w.PING] and not t.closed
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678"))
    _, code, text = goaway_of(t.frames())
    assert (code, text) == (w.ENHANCE_YOUR_CALM, b"too_many_pings") and t.closed


async def test_pings_between_answers_or_far_enough_apart_are_no_strikes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn, t, _ = connect()
    conn.data_received(headers(1))
    for _ in range(10):  # each PING follows data the server sent
        conn.data_received(data(1, w.grpc_message(b"e")) + w.frame(w.PING, 0, 0, b"12345678"))
    assert not t.closed
    monkeypatch.setattr(h2limits, "MIN_PING_INTERVAL", 0.0)
    for _ in range(10):
        conn.data_received(w.frame(w.PING, 0, 0, b"12345678"))
    assert not t.closed


async def test_keepalive_pings_a_silent_client_and_closes_it_when_it_stays_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(h2limits, "KEEPALIVE_TIME", 0.05)
    monkeypatch.setattr(h2limits, "KEEPALIVE_TIMEOUT", 0.05)
    conn, t, log = connect()
    conn.data_received(headers(1))
    await asyncio.sleep(0.08)
    ((ftype, flags, _, opaque),) = t.frames()
    assert (ftype, flags) == (w.PING, 0) and not t.closed
    conn.data_received(w.frame(w.PING, w.ACK, 0, opaque))  # alive
    await asyncio.sleep(0.08)
    assert not t.closed
    for _ in range(50):
        await asyncio.sleep(0.02)
        if t.closed:
            break
    assert t.closed  # then silent: closed
    conn.connection_lost(None)
    assert log == [("reset",)]


async def test_a_full_write_buffer_pauses_reading_until_it_drains() -> None:
    conn, t, _ = connect()
    conn.pause_writing()
    assert not t.reading
    conn.resume_writing()
    assert t.reading
