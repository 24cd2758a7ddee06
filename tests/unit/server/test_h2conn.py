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
    decoder = hpack.Decoder()
    assert decoder.decode(frames[0][3]) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
    ]
    trailers = decoder.decode(frames[2][3])
    assert trailers == [("grpc-status", "0")] and frames[2][1] & w.END_STREAM


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
    conn.data_received(w.window_update(1, 1))  # a window of one byte is used
    assert t.frames() == [(w.DATA, 0, 1, w.grpc_message(b"a" * 20)[10:11])]
    conn.data_received(w.window_update(1, 100))
    frames = t.frames()
    assert [f[:3] for f in frames if f[0] == w.DATA] == [(w.DATA, 0, 1)]  # no END_STREAM on data
    assert sum(len(f[3]) for f in frames if f[0] == w.DATA) == 14
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
    assert payload[8:] == b"not an HTTP/2 connection preface"
    assert t.closed


def test_goaway_refuses_new_streams_only_after_its_ping_and_lets_open_ones_end() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1))
    conn.goaway()
    (first, ping) = t.frames()
    assert ping[:3] == (w.PING, 0, 0)  # a PING the client must answer
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


def goaway_of(t: FakeTransport) -> tuple[int, bytes]:
    """The connection ended with one GOAWAY: its error code and debug text."""
    frames = t.frames()
    assert [f[0] for f in frames][-1] == w.GOAWAY and t.closed
    payload = frames[-1][3]
    return struct.unpack(">I", payload[4:8])[0], payload[8:]


def test_a_frame_over_16384_bytes_is_a_frame_size_error() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.PING, 0, 0, bytes(w.DEFAULT_MAX_FRAME)))
    assert t.frames() == [(w.PING, w.ACK, 0, bytes(16_384))]  # the largest allowed
    conn.data_received(w.frame_header(w.DATA, 0, 1, 16_385))
    assert goaway_of(t) == (w.FRAME_SIZE_ERROR, b"a 16385-byte frame")


def test_a_header_block_must_not_be_interrupted() -> None:
    conn, t, _ = connect()
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/echo")])
    conn.data_received(w.frame(w.HEADERS, 0, 1, block) + data(1, b""))
    assert goaway_of(t) == (w.PROTOCOL_ERROR, b"header block interrupted")


def test_continuation_of_another_stream_is_a_protocol_error() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.CONTINUATION, w.END_HEADERS, 1, b""))
    assert goaway_of(t) == (w.PROTOCOL_ERROR, b"CONTINUATION without HEADERS")
    conn, t, _ = connect()
    block = hpack.Encoder().encode([(":method", "POST"), (":path", "/echo")])
    conn.data_received(
        w.frame(w.HEADERS, 0, 1, block) + w.frame(w.CONTINUATION, w.END_HEADERS, 3, b"")
    )
    assert goaway_of(t) == (w.PROTOCOL_ERROR, b"CONTINUATION without HEADERS")


def test_a_header_block_over_1_mib_ends_the_connection() -> None:
    conn, t, _ = connect()
    piece = bytes(w.DEFAULT_MAX_FRAME)
    wire = w.frame(w.HEADERS, 0, 1, piece)
    wire += w.frame(w.CONTINUATION, 0, 1, piece) * 63  # exactly 1 MiB: still accepted
    conn.data_received(wire)
    assert t.frames() == [] and not t.closed
    conn.data_received(w.frame(w.CONTINUATION, w.END_HEADERS, 1, b"\x82"))
    assert goaway_of(t) == (w.PROTOCOL_ERROR, b"header block over 1 MiB")


def test_an_undecodable_header_block_is_a_compression_error() -> None:
    conn, t, log = connect()
    conn.data_received(w.frame(w.HEADERS, w.END_HEADERS, 1, b"\xff\xff\xff\xff\xff"))
    code, text = goaway_of(t)
    assert code == w.COMPRESSION_ERROR and text.startswith(b"bad header block: ")
    assert log == []


def test_a_compressed_message_is_unimplemented() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, b"\x01\x00\x00\x00\x01x"))
    frames = t.frames()
    fields = dict(hpack.Decoder().decode(frames[0][3]))
    assert fields["grpc-status"] == str(w.GRPC_UNIMPLEMENTED)
    assert fields["grpc-message"] == "compressed messages are not accepted"
    assert frames[1][:3] == (w.RST_STREAM, 0, 1) and log == [("reset",)]


def test_oversized_message_names_the_limit_and_a_message_at_the_limit_passes() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, w.grpc_message(b"m" * 1000), end=True))
    assert log == [("message", b"m" * 1000), ("half_close",)]
    t.frames()
    conn.data_received(headers(3) + data(3, w.grpc_message(b"m" * 1001)))
    fields = dict(hpack.Decoder().decode(t.frames()[0][3]))
    assert fields["grpc-message"] == "message over 1000 bytes"


def test_answering_before_the_client_ends_resets_its_stream_with_no_error() -> None:
    conn, t, _ = connect()
    conn.data_received(headers(1, "/nope"))
    frames = t.frames()
    assert [f[:3] for f in frames] == [
        (w.HEADERS, w.END_HEADERS | w.END_STREAM, 1),
        (w.RST_STREAM, 0, 1),
    ]
    assert struct.unpack(">I", frames[1][3])[0] == w.NO_ERROR
    fields = dict(hpack.Decoder().decode(frames[0][3]))
    assert fields["grpc-message"] == "unknown method /nope"
    conn.data_received(data(1, b"late", end=True))  # dropped, and the stream forgotten
    assert t.frames() == [] and not conn.streams


def test_client_trailers_half_close_the_call() -> None:
    conn, t, log = connect()
    trailers = w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 1, hpack.Encoder().encode([]))
    conn.data_received(headers(1) + data(1, w.grpc_message(b"q")) + trailers)
    assert log == [("message", b"q"), ("half_close",)]
    assert [f[0] for f in t.frames()] == [w.HEADERS, w.DATA, w.HEADERS]


def test_even_and_reused_stream_ids_open_no_call_but_keep_hpack_in_step() -> None:
    conn, _t, log = connect()
    enc = hpack.Encoder()

    def block(sid: int) -> bytes:  # indexed: each block changes the shared table
        return w.frame(w.HEADERS, w.END_HEADERS, sid, enc.encode([(":path", "/echo")]))

    conn.data_received(block(3) + block(2) + block(1) + block(3))
    assert list(conn.streams) == [3]
    conn.data_received(block(5))
    assert list(conn.streams) == [3, 5]  # decoded with the right table
    conn.data_received(data(5, w.grpc_message(b"five"), end=True))
    assert log == [("message", b"five"), ("half_close",)]


def test_the_connection_window_holds_data_across_streams() -> None:
    conn = Connection(lambda path, io: Echo(io, []), 200_000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    settings = w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
    conn.data_received(w.PREFACE + settings)
    t.frames()
    message = w.grpc_message(b"b" * 70_000)
    conn.data_received(headers(1) + data(1, message[:16_000]))
    for i in range(16_000, len(message), 16_000):
        conn.data_received(data(1, message[i : i + 16_000]))
    sent = [f for f in t.frames() if f[0] == w.DATA]
    assert max(len(f[3]) for f in sent) == w.DEFAULT_MAX_FRAME  # the peer's frame size
    assert sum(len(f[3]) for f in sent) == w.DEFAULT_WINDOW  # the connection window
    conn.data_received(w.window_update(0, 10_000) + data(1, b"", end=True))
    frames = t.frames()
    assert [f[0] for f in frames] == [w.DATA, w.HEADERS]
    assert w.DEFAULT_WINDOW + len(frames[0][3]) == len(message)


def test_settings_apply_to_open_streams_and_the_last_setting_counts() -> None:
    conn = Connection(lambda path, io: Echo(io, []), 200_000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + w.settings_frame({}) + headers(1))
    t.frames()
    settings = w.settings_frame(
        {w.SETTINGS_INITIAL_WINDOW_SIZE: 65_535 + 100, w.SETTINGS_MAX_FRAME_SIZE: 40_000}
    )
    conn.data_received(settings + w.window_update(0, 1_000_000))
    assert t.frames() == [(w.SETTINGS, w.ACK, 0, b"")]
    message = w.grpc_message(b"c" * 65_600)
    for i in range(0, len(message), 16_000):
        conn.data_received(data(1, message[i : i + 16_000]))
    conn.data_received(data(1, b"", end=True))
    frames = t.frames()
    sizes = [len(f[3]) for f in frames if f[0] == w.DATA]
    assert sizes == [40_000, 25_605]  # the peer's frame size; the window grew by 100
    assert frames[-1][0] == w.HEADERS
    conn.data_received(headers(3))
    conn.data_received(w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: 10}))
    t.frames()
    conn.data_received(data(3, w.grpc_message(b"d" * 20), end=True))
    assert sum(len(f[3]) for f in t.frames() if f[0] == w.DATA) == 10
    assert conn.streams[3].window == 0


def test_a_settings_ack_and_a_foreign_ping_ack_are_not_answered() -> None:
    conn, t, _ = connect()
    conn.data_received(w.frame(w.SETTINGS, w.ACK, 0) + w.frame(w.PING, w.ACK, 0, b"other!!!"))
    assert t.frames() == []


def test_a_peer_goaway_starts_the_drain_once() -> None:
    conn, t, _ = connect()
    conn.data_received(w.goaway(0, w.NO_ERROR))
    frames = t.frames()
    assert [f[0] for f in frames] == [w.GOAWAY, w.PING] and conn.goaway_sent
    conn.goaway()
    conn.data_received(w.goaway(0, w.NO_ERROR))
    assert t.frames() == []
    conn.data_received(w.frame(w.PING, w.ACK, 0, frames[1][3]) * 2)
    assert [f[0] for f in t.frames()] == [w.GOAWAY]  # the final GOAWAY, once


def test_a_lost_connection_reports_itself_closed_and_skips_finished_calls() -> None:
    closed: list[Connection] = []
    log: list[Any] = []
    conn = Connection(lambda path, io: Echo(io, log), 1000, closed.append)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + headers(1) + headers(3, "/echo", end=True))
    assert log == [("half_close",)]  # stream 3 is answered and gone; stream 1 still open
    conn.connection_lost(None)
    assert log == [("half_close",), ("reset",)] and closed == [conn] and not conn.streams


def test_nothing_is_written_to_a_closing_transport() -> None:
    conn, t, _ = connect()
    t.closed = True
    conn.data_received(w.frame(w.PING, 0, 0, b"12345678"))
    conn.goaway()
    assert t.frames() == []


def test_the_server_grants_the_largest_windows_and_refuses_push_at_once() -> None:
    conn = Connection(lambda path, io: None, 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    (settings, grant) = t.frames()
    assert settings[:3] == (w.SETTINGS, 0, 0)
    pairs = [struct.unpack(">HI", settings[3][i : i + 6]) for i in range(0, len(settings[3]), 6)]
    assert dict(pairs) == {w.SETTINGS_INITIAL_WINDOW_SIZE: 2**31 - 1, w.SETTINGS_ENABLE_PUSH: 0}
    assert grant[:3] == (w.WINDOW_UPDATE, 0, 0)
    assert struct.unpack(">I", grant[3])[0] == 2**31 - 1 - 65_535


def test_the_reserved_stream_id_bit_is_ignored() -> None:
    conn, _t, log = connect()
    conn.data_received(headers(1) + data(1 | 1 << 31, w.grpc_message(b"r"), end=True))
    assert log == [("message", b"r"), ("half_close",)]


def test_the_connection_window_is_refilled_after_1_gib_received() -> None:
    conn, t, _ = connect()
    chunk = data(99, bytes(w.DEFAULT_MAX_FRAME)) * 64  # 1 MiB on a stream never opened
    for _ in range(1023):
        conn.data_received(chunk)
    assert t.frames() == []
    conn.data_received(chunk)
    assert t.frames() == [(w.WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 30))]
    conn.data_received(chunk)  # counting starts again
    assert t.frames() == []


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


def test_trailers_queued_behind_data_go_out_once_the_window_opens() -> None:
    conn = Connection(lambda path, io: OneShot(io), 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: 10}))
    t.frames()
    message = w.grpc_message(b"a" * 20)
    conn.data_received(headers(1) + data(1, message))
    assert [f[0] for f in t.frames()] == [w.HEADERS, w.DATA]  # 10 bytes; trailers wait
    conn.data_received(data(1, b"", end=True))  # the client ends while they wait
    assert t.frames() == []
    conn.data_received(w.window_update(1, 100))
    frames = t.frames()
    assert [f[:3] for f in frames] == [(w.DATA, 0, 1), (w.HEADERS, w.END_HEADERS | w.END_STREAM, 1)]
    assert frames[0][3] == message[10:]  # and no RST_STREAM: the client had ended
    assert not conn.streams


def test_close_closes_the_transport() -> None:
    conn, t, _ = connect()
    conn.close()
    assert t.closed


class Twice(OneShot):
    def on_message(self, data: bytes) -> None:
        self.io.finish(w.GRPC_OK)
        self.io.send(b"too late")
        self.io.finish(w.GRPC_INTERNAL, "again")


def test_a_call_finishes_once_and_sends_nothing_after() -> None:
    conn = Connection(lambda path, io: Twice(io), 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    conn.data_received(w.PREFACE + headers(1) + data(1, w.grpc_message(b"x"), end=True))
    frames = [f for f in t.frames() if f[2] == 1]
    assert [f[0] for f in frames] == [w.HEADERS, w.RST_STREAM]
    assert hpack.Decoder().decode(frames[0][3]) == [
        (":status", "200"),
        ("content-type", "application/grpc"),
        ("grpc-status", "0"),
    ]


def test_a_request_without_a_path_is_an_unknown_method() -> None:
    conn, t, _ = connect()
    block = hpack.Encoder().encode([(":method", "POST")])
    conn.data_received(w.frame(w.HEADERS, w.END_HEADERS | w.END_STREAM, 1, block))
    ((_, _, _, trailers),) = t.frames()
    assert dict(hpack.Decoder().decode(trailers))["grpc-message"] == "unknown method "


def test_two_messages_in_one_data_frame_are_delivered_in_order() -> None:
    conn, _t, log = connect()
    both = w.grpc_message(b"first") + w.grpc_message(b"second!")
    conn.data_received(headers(1) + data(1, both, end=True))
    assert log == [("message", b"first"), ("message", b"second!"), ("half_close",)]


def test_a_call_is_freed_without_the_cycle_collector_once_its_stream_ends() -> None:
    import gc
    import weakref

    calls: list[weakref.ref[Echo]] = []

    def route(path: str, io: CallIO) -> Echo:
        call = Echo(io, [])
        calls.append(weakref.ref(call))
        return call

    conn = Connection(route, 1000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    gc.disable()
    try:
        conn.data_received(w.PREFACE + w.settings_frame({}))
        conn.data_received(headers(1) + data(1, w.grpc_message(b"x"), end=True))  # ends OK
        conn.data_received(headers(3) + w.rst_stream(3, w.CANCEL))  # reset by the peer
        conn.data_received(headers(5) + data(5, struct.pack(">BI", 0, 5000)))  # aborted
        conn.data_received(headers(7))  # open when the connection is lost
        conn.connection_lost(None)
        assert len(calls) == 4
        assert [ref() for ref in calls] == [None, None, None, None]
    finally:
        gc.enable()


def test_replies_that_fit_spend_the_stream_window_and_an_update_adds_to_what_is_left() -> None:
    conn, t, _log = connect()
    conn.data_received(w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: 30}))
    t.frames()
    msg = w.grpc_message(b"a" * 11)  # 16 bytes
    conn.data_received(headers(1) + data(1, msg))
    assert t.frames() == [
        (w.HEADERS, w.END_HEADERS, 1, w.RESPONSE_HEADERS),
        (w.DATA, 0, 1, msg),
    ]
    conn.data_received(w.window_update(1, 5))  # 14 left + 5
    assert t.frames() == []
    conn.data_received(data(1, msg))
    assert t.frames() == [(w.DATA, 0, 1, msg)]  # 3 left
    conn.data_received(data(1, msg))
    assert t.frames() == [(w.DATA, 0, 1, msg[:3])]


def test_replies_that_fit_spend_the_connection_window_and_an_update_adds_to_what_is_left() -> None:
    conn = Connection(lambda path, io: Echo(io, []), 200_000, print)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    settings = w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW})
    conn.data_received(w.PREFACE + settings + headers(1))
    t.frames()
    msg = w.grpc_message(b"c" * (w.DEFAULT_MAX_FRAME - 5))  # one full frame
    for _ in range(3):
        conn.data_received(data(1, msg))
    sent = t.frames()
    assert [(f[0], len(f[3])) for f in sent[1:]] == [(w.DATA, w.DEFAULT_MAX_FRAME)] * 3
    conn.data_received(w.window_update(0, 100))  # 16,383 left + 100
    conn.data_received(data(1, msg))
    assert t.frames() == [(w.DATA, 0, 1, msg)]  # 99 left
    conn.data_received(data(1, msg))
    assert t.frames() == [(w.DATA, 0, 1, msg[:99])]


def test_a_read_that_ends_inside_a_frame_keeps_only_the_unread_bytes() -> None:
    conn, _t, log = connect()
    second = data(1, w.grpc_message(b"two"), end=True)
    conn.data_received(headers(1) + data(1, w.grpc_message(b"one")) + second[:12])
    assert log == [("message", b"one")]
    conn.data_received(second[12:])
    assert log == [("message", b"one"), ("message", b"two"), ("half_close",)]


def test_a_reset_of_a_stream_that_already_ended_is_ignored() -> None:
    conn, t, log = connect()
    conn.data_received(headers(1) + data(1, w.grpc_message(b"x"), end=True))
    assert list(conn.streams) == []
    t.frames()
    conn.data_received(w.rst_stream(1, w.CANCEL) + w.rst_stream(7, w.CANCEL))
    assert log == [("message", b"x"), ("half_close",)] and t.frames() == []


def test_padding_and_priority_fields_are_stripped_before_the_block_and_the_messages() -> None:
    conn, _t, log = connect()
    block = hpack.Encoder().encode([(":path", "/echo"), (":method", "POST")])  # path first
    priority = struct.pack(">IB", 0, 15)  # depends on stream 0, weight 16
    flags = w.END_HEADERS | w.PADDED | w.PRIORITY_FLAG
    wire = w.frame(w.HEADERS, flags, 1, bytes([4]) + priority + block + bytes(4))
    padded = bytes([6]) + w.grpc_message(b"x") + bytes(6)  # padding long enough to parse
    wire += w.frame(w.DATA, w.PADDED | w.END_STREAM, 1, padded)
    conn.data_received(wire)
    assert log == [("message", b"x"), ("half_close",)]
