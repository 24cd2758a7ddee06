"""The wire pieces only the hand-written HTTP/2 baseline of ``epp bench engines`` uses
(``epp_tools.bench.engines.h2baseline``): its connection error, and the HPACK literal header blocks
it wrote.

Header blocks are HPACK literals that never touch the dynamic table (RFC 7541 §6.2.2, "without
indexing"; ``:status 200`` is static index 8), so they need no encoder state and are the same
bytes on every connection.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote


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
