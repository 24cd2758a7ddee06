"""HTTP/2 and gRPC wire pieces of the ext_proc server (``epp.server.h2``): frame headers, the
constant header blocks a gRPC server sends, gRPC status trailers and message framing.

Header blocks the server sends are HPACK literals that never touch the dynamic table (RFC 7541
§6.2.2, "without indexing"; ``:status 200`` is static index 8), so they need no encoder state and
are the same bytes on every connection. What the peer sends is decoded with ``hpack.Decoder``.
"""

from __future__ import annotations

import struct
from typing import Final
from urllib.parse import quote

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types (RFC 9113 §6)
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# flags
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# settings
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# error codes
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9

DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1

# gRPC status codes used here
GRPC_OK: Final = 0
GRPC_CANCELLED: Final = 1
GRPC_UNKNOWN: Final = 2
GRPC_INVALID_ARGUMENT: Final = 3
GRPC_RESOURCE_EXHAUSTED: Final = 8
GRPC_UNIMPLEMENTED: Final = 12
GRPC_INTERNAL: Final = 13
GRPC_UNAVAILABLE: Final = 14

FRAME_HEADER: Final = struct.Struct(">BHBBI")
"""Length (24 bits, split 8 + 16), type, flags, stream id (the top bit reserved)."""
MESSAGE_PREFIX: Final = struct.Struct(">BI")
"""gRPC length-prefixed message: compressed flag, length."""


class H2Error(Exception):
    """A connection error: the connection ends with GOAWAY carrying ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 16, n & 0xFFFF, ftype, flags, stream_id) + payload


def frame_header(ftype: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, ftype, flags, stream_id)


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(struct.pack(">HI", k, v) for k, v in values.items())
    return frame(SETTINGS, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id, code) + debug)


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


def grpc_message(payload: bytes) -> bytes:
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload
