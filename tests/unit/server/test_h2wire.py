"""The HTTP/2 and gRPC wire pieces of the h2 server (frames read back by an independent parser,
``hyperframe``), and the header fields and trailers it sends."""

from __future__ import annotations

import pytest
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from epp.server import h2wire as w


def parse(data: bytes) -> Frame:
    frame, length = Frame.parse_frame_header(memoryview(data[:9]))
    assert length == len(data) - 9
    frame.parse_body(memoryview(data[9:]))
    return frame


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 70_001, (1 << 24) - 1])
def test_frame_length_spans_all_24_bits(size: int) -> None:
    payload = bytes(size)
    frame = parse(w.frame(w.DATA, w.END_STREAM, 7, payload))
    assert isinstance(frame, DataFrame)
    assert (frame.stream_id, frame.data, "END_STREAM" in frame.flags) == (7, payload, True)
    header = w.frame_header(w.DATA, 0, 9, size)
    assert header == w.frame(w.DATA, 0, 9, payload)[:9]


def test_control_frames_read_back_as_sent() -> None:
    settings = parse(w.settings_frame({w.SETTINGS_INITIAL_WINDOW_SIZE: w.MAX_WINDOW, 2: 0}))
    assert isinstance(settings, SettingsFrame) and settings.stream_id == 0
    assert settings.settings == {SettingsFrame.INITIAL_WINDOW_SIZE: 2**31 - 1, 2: 0}
    update = parse(w.window_update(3, 1_000_000))
    assert isinstance(update, WindowUpdateFrame)
    assert (update.stream_id, update.window_increment) == (3, 1_000_000)
    reset = parse(w.rst_stream(5, w.REFUSED_STREAM))
    assert isinstance(reset, RstStreamFrame) and (reset.stream_id, reset.error_code) == (5, 7)
    gone = parse(w.goaway(11, w.PROTOCOL_ERROR, b"why"))
    assert isinstance(gone, GoAwayFrame) and gone.stream_id == 0
    assert (gone.last_stream_id, gone.error_code, gone.additional_data) == (11, 1, b"why")
    assert parse(w.goaway(1, w.NO_ERROR)).additional_data == b""


def test_response_headers_are_status_200_and_grpc_content_type() -> None:
    assert w.RESPONSE_HEADERS == [(b":status", b"200"), (b"content-type", b"application/grpc")]


def test_status_trailers_percent_encode_only_what_grpc_says() -> None:
    assert w.status_headers(0) == [(b"grpc-status", b"0")]
    printable = "".join(map(chr, range(0x20, 0x7F)))
    fields = dict(w.status_headers(w.GRPC_INVALID_ARGUMENT, printable + "\né"))
    assert fields[b"grpc-status"] == b"3"
    # every printable ASCII character but "%" goes as it is; the rest as %XX of its UTF-8
    assert fields[b"grpc-message"] == printable.replace("%", "%25").encode() + b"%0A%C3%A9"


def test_grpc_message_is_an_uncompressed_length_prefixed_payload() -> None:
    assert w.grpc_message(b"") == b"\x00\x00\x00\x00\x00"
    assert w.grpc_message(b"a" * 300) == b"\x00\x00\x00\x01\x2c" + b"a" * 300
