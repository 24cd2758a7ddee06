"""Protocol buffers' wire format, by hand: enough to read and write the few messages the
simulator's gRPC APIs use (``epp_tools.sim.grpcapi``), without generated code.

A message decodes into ``{field number: [values]}``: varints as ``int``, length-delimited fields
as ``bytes`` (a string, a nested message or a packed repeated field; the caller knows which),
fixed-width fields as their raw bytes. Malformed input raises ``ValueError``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

Fields = dict[int, list[int | bytes]]

_MAX_VARINT_BYTES = 10


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are 10-byte two's complement
    out = bytearray()
    for _ in range(_MAX_VARINT_BYTES):
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            break
    return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value, pos
    raise ValueError("varint longer than 10 bytes")


def decode(data: bytes) -> Fields:
    fields: Fields = {}
    pos = 0
    while pos < len(data):  # each turn consumes at least one byte
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = read_varint(data, pos)
        elif wire == 2:
            length, pos = read_varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated length-delimited field")
            value, pos = data[pos : pos + length], pos + length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > len(data):
                raise ValueError("truncated fixed-width field")
            value, pos = data[pos : pos + width], pos + width
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if number == 0:
            raise ValueError("field number 0")
        fields.setdefault(number, []).append(value)
    return fields


def first(fields: Fields, number: int, default: int | bytes = b"") -> int | bytes:
    values = fields.get(number)
    return values[-1] if values else default  # the last occurrence wins, as protobuf's


def uint32s(values: Iterable[int | bytes]) -> list[int]:
    """A repeated varint field, packed (bytes) or not (ints)."""
    out: list[int] = []
    for value in values:
        if isinstance(value, int):
            out.append(value)
            continue
        pos = 0
        while pos < len(value):
            item, pos = read_varint(value, pos)
            out.append(item)
    return out


def field_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value) if value else b""


def field_bytes(number: int, value: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(value)) + value


def field_packed_varints(number: int, values: Iterable[int]) -> bytes:
    packed = b"".join(varint(v) for v in values)
    return field_bytes(number, packed) if packed else b""


def field_packed_floats(number: int, values: Iterable[float]) -> bytes:
    packed = b"".join(struct.pack("<f", v) for v in values)
    return field_bytes(number, packed) if packed else b""
