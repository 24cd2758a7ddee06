"""gRPC message framing, shared by the parsers of gRPC APIs (``vllmgrpc-parser``,
``vertexai-parser``).

A gRPC body is a sequence of length-prefixed messages: a 1-byte compressed flag, a 4-byte
big-endian length, then that many bytes of protobuf. The parsers read uncompressed messages only
(the flag must be 0, as upstream; compressed requests are a 400).

* ``request_message(body, where)``: the one message of a unary request, or a 400 naming what is
  wrong (too short, compressed, a length past the end, bytes after the message);
* ``decode(message_type, payload, where)``: protobuf bytes into a message, or a 400;
* ``FrameReader``: response messages as they arrive, a message split across body chunks
  reassembled (up to ``MAX_MESSAGE`` bytes; a larger or compressed message is skipped unread);
  ``messages(body)`` the same for a whole body.
"""

from __future__ import annotations

from typing import Final, TypeVar

from google.protobuf.message import DecodeError, Message

from epp.plugins.parsers.common import bad_request

HEADER: Final = 5
MAX_MESSAGE: Final = 64 << 20
"""A response message longer than this is skipped (its usage, if any, is lost) rather than
buffered."""

M = TypeVar("M", bound=Message)


def frame(payload: bytes) -> bytes:
    """``payload`` as one uncompressed gRPC message (for tests and tools)."""
    return b"\0" + len(payload).to_bytes(4, "big") + payload


def request_message(body: bytes, where: str) -> bytes:
    """The single message of a unary gRPC request body."""
    if len(body) < HEADER:
        raise bad_request(
            f"{where}invalid gRPC frame: expected at least {HEADER} bytes, got {len(body)}"
        )
    flag = body[0]
    if flag == 1:
        raise bad_request(f"{where}compressed gRPC messages are not supported")
    if flag != 0:
        raise bad_request(f"{where}invalid gRPC frame: compressed flag {flag}")
    length = int.from_bytes(body[1:HEADER], "big")
    available = len(body) - HEADER
    if length > available:
        raise bad_request(
            f"{where}incomplete gRPC message: its header says {length} bytes, {available} arrived"
        )
    if length < available:
        raise bad_request(f"{where}{available - length} bytes after the gRPC message")
    return body[HEADER:]


def decode(message_type: type[M], payload: bytes, where: str) -> M:
    """Decode protobuf bytes; malformed bytes are a 400 naming the message type."""
    message: M = message_type()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        name = message_type.DESCRIPTOR.name
        raise bad_request(f"{where}malformed {name}: not a valid protobuf message") from None
    return message


def try_decode(message_type: type[M], payload: bytes) -> M | None:
    """Decode protobuf bytes, ``None`` when they are not a valid message."""
    message: M = message_type()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        return None
    return message


class FrameReader:
    """Reassembles a response's gRPC messages from its body chunks; ``feed`` returns the messages
    a chunk completed, in order. Memory is bounded: at most one message (``MAX_MESSAGE``) is
    held."""

    __slots__ = ("_buffer", "_skip")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0  # bytes still to drop of a message too large (or compressed) to read

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._skip:
            dropped = min(self._skip, len(chunk))
            self._skip -= dropped
            chunk = chunk[dropped:]
        self._buffer += chunk
        buffer = self._buffer
        out: list[bytes] = []
        start = 0
        # Each turn consumes a whole message (at least HEADER bytes) or stops.
        while len(buffer) - start >= HEADER:
            flag = buffer[start]
            length = int.from_bytes(buffer[start + 1 : start + HEADER], "big")
            end = start + HEADER + length
            if flag != 0 or length > MAX_MESSAGE:
                self._skip = max(end - len(buffer), 0)
                start = min(end, len(buffer))
                continue
            if end > len(buffer):
                break
            out.append(bytes(buffer[start + HEADER : end]))
            start = end
        del buffer[:start]
        return out


def messages(body: bytes) -> list[bytes]:
    """The uncompressed messages of a whole gRPC body (a trailing partial message is ignored)."""
    return FrameReader().feed(body)
