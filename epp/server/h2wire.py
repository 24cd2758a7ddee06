"""HTTP/2 and gRPC wire pieces of the ext_proc server (``epp.server.h2``): the header fields a
gRPC server sends, gRPC status trailers and message framing, and the HTTP/2 frame vocabulary
(types, flags, settings, error codes, frame builders).

The HTTP/2 engine (libnghttp2, ``epp.server.h2conn``) encodes and frames what the server sends;
the frame builders here write the one frame the server writes itself (the GOAWAY that ends a
connection the engine gave up on) and the frames that tests and benchmarks send as a client.
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
ENHANCE_YOUR_CALM: Final = 0xB

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


Headers = list[tuple[bytes, bytes]]

RESPONSE_HEADERS: Final[Headers] = [(b":status", b"200"), (b"content-type", b"application/grpc")]

_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


def status_headers(code: int, message: str = "") -> Headers:
    """The trailers of a gRPC call: ``grpc-status`` and, when set, ``grpc-message``
    (percent-encoded as the gRPC HTTP/2 protocol says)."""
    fields = [(b"grpc-status", str(code).encode())]
    if message:
        fields.append((b"grpc-message", quote(message, safe=_MESSAGE_SAFE).encode()))
    return fields


def grpc_message(payload: bytes) -> bytes:
    return MESSAGE_PREFIX.pack(0, len(payload)) + payload
