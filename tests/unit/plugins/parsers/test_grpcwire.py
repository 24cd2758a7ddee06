"""gRPC message framing of the gRPC parsers: reassembly across chunks, bounded memory."""

from __future__ import annotations

import pytest

from epp.plugins.parsers import grpcwire
from epp.plugins.parsers.grpcwire import FrameReader, frame, messages


def test_messages_split_anywhere_are_reassembled_in_order() -> None:
    raw = frame(b"one") + frame(b"") + frame(b"three" * 50)
    for size in (1, 2, 5, 7, 1000):
        reader = FrameReader()
        out = [m for i in range(0, len(raw), size) for m in reader.feed(raw[i : i + size])]
        assert out == [b"one", b"", b"three" * 50], size


def test_a_trailing_partial_message_is_not_returned() -> None:
    assert messages(frame(b"ok") + frame(b"partial")[:-1]) == [b"ok"]


def test_oversized_and_compressed_messages_are_skipped_unbuffered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpcwire, "MAX_MESSAGE", 8)
    raw = frame(b"x" * 100) + b"\x01" + frame(b"zipped")[1:] + frame(b"small")
    reader = FrameReader()
    out = []
    for i in range(0, len(raw), 3):
        out += reader.feed(raw[i : i + 3])
        assert len(reader._buffer) <= 8 + grpcwire.HEADER
    assert out == [b"small"]
