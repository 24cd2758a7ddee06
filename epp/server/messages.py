"""Builders for the ext_proc ``ProcessingResponse`` messages the EPP sends, and a decoder written
by hand for the ``ProcessingRequest`` Envoy sends most often, a response body chunk."""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, TypeAlias, cast

from google.protobuf import json_format, struct_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import InferenceError, wire

_OVERWRITE = pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
BodyMode: TypeAlias = pb.ProcessingMode.BodySendMode


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Lower-cased header map; Envoy fills ``raw_value`` and leaves ``value`` empty."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def metadata_namespaces(request: pb.ProcessingRequest, names: Sequence[str]) -> dict[str, Any]:
    """Only the filter-metadata namespaces we read, converted to plain Python values."""
    if not request.HasField("metadata_context"):
        return {}
    fm = request.metadata_context.filter_metadata
    return {n: json_format.MessageToDict(fm[n]) for n in names if n in fm}


def served_endpoint(request: pb.ProcessingRequest) -> str:
    """The response-phase ``envoy.lb`` ``x-gateway-destination-endpoint-served`` value as text
    (``""`` when absent): what ``metadata_namespaces`` and ``str`` give, reading the one field
    instead of converting the namespace (this is on every response's first-token path)."""
    if not request.HasField("metadata_context"):
        return ""
    fm = request.metadata_context.filter_metadata
    if wire.LB_NAMESPACE not in fm:
        return ""
    fields = fm[wire.LB_NAMESPACE].fields
    if wire.SERVED_HEADER not in fields:
        return ""
    value = fields[wire.SERVED_HEADER]
    if value.WhichOneof("kind") == "string_value":
        return str(value.string_value)
    return str(json_format.MessageToDict(value))


def mutation(set_headers: Mapping[str, str], remove: Sequence[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            pb.HeaderValueOption(
                header=pb.HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE
            )
            for k, v in set_headers.items()
        ],
        # Envoy applies removals before sets, but a key we set needs no removal anyway.
        remove_headers=[h for h in remove if h not in set_headers],
    )


def lb_metadata(values: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update({wire.LB_NAMESPACE: dict(values)})
    return s


def request_headers_reply(
    set_headers: Mapping[str, str],
    remove: Sequence[str],
    metadata: Mapping[str, Any] | None,
    *,
    clear_route_cache: bool = True,
) -> pb.ProcessingResponse:
    resp = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                clear_route_cache=clear_route_cache,
                header_mutation=mutation(set_headers, remove),
            )
        )
    )
    if metadata:
        resp.dynamic_metadata.CopyFrom(lb_metadata(metadata))
    return resp


def buffered_body_reply(
    set_headers: Mapping[str, str],
    remove: Sequence[str],
    metadata: Mapping[str, Any] | None,
    body: bytes | None,
) -> pb.ProcessingResponse:
    """BUFFERED mode: the decision rides on the body reply (headers are still held by Envoy)."""
    common = pb.CommonResponse(
        clear_route_cache=True, header_mutation=mutation(set_headers, remove)
    )
    if body is not None:
        common.body_mutation.body = body
    resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    if metadata:
        resp.dynamic_metadata.CopyFrom(lb_metadata(metadata))
    return resp


def streamed_body(body: bytes, *, response: bool, end_of_stream: bool = True) -> list[bytes]:
    """FULL_DUPLEX_STREAMED body replies in pieces of at most 62,000 bytes (EOS on the last),
    already serialized: this is the reply to every streamed response chunk, and building it as
    protobuf objects cost more than everything else the EPP does per chunk (``encoded_body``)."""
    n = len(body)
    if n <= wire.MAX_BODY_CHUNK:  # one piece, ``encoded_body`` inlined: the reply to each token
        head, tail = _framing(n, response, end_of_stream)
        return [head + body + tail if tail else head + body]
    return [
        encoded_body(
            body[i : i + wire.MAX_BODY_CHUNK],
            response=response,
            end_of_stream=end_of_stream and i + wire.MAX_BODY_CHUNK >= n,
        )
        for i in range(0, n, wire.MAX_BODY_CHUNK)
    ]


_SMALL = tuple(bytes((i,)) for i in range(128))


def _varint(value: int) -> bytes:
    if value < 128:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field_number(message: Any, name: str) -> int:
    return int(message.DESCRIPTOR.fields_by_name[name].number)


def _len_tag(number: int) -> bytes:
    return _varint(number << 3 | 2)


# The nesting of a streamed body reply, outermost first: ProcessingResponse.{request,response}_body
# → BodyResponse.response → CommonResponse.body_mutation → BodyMutation.streamed_response, whose
# StreamedBodyResponse holds ``body`` and ``end_of_stream``. Field numbers come from the
# descriptors, so a schema change cannot go unnoticed.
_REQUEST_TAG = _len_tag(_field_number(pb.ProcessingResponse, "request_body"))
_RESPONSE_TAG = _len_tag(_field_number(pb.ProcessingResponse, "response_body"))
_INNER_TAGS = (
    _len_tag(_field_number(pb.BodyResponse, "response")),
    _len_tag(_field_number(pb.CommonResponse, "body_mutation")),
    _len_tag(_field_number(pb.BodyMutation, "streamed_response")),
)
_BODY_TAG = _len_tag(_field_number(pb.StreamedBodyResponse, "body"))
_EOS = _varint(_field_number(pb.StreamedBodyResponse, "end_of_stream") << 3) + b"\x01"


def encoded_body(body: bytes, *, response: bool, end_of_stream: bool) -> bytes:
    """One serialized ``ProcessingResponse`` carrying ``body`` as a streamed body mutation; the
    same bytes ``SerializeToString`` gives (proto3 omits an empty body and a false flag)."""
    head, tail = _framing(len(body), response, end_of_stream)
    return b"".join((head, body, tail))


@functools.lru_cache(maxsize=4096)
def _framing(n: int, response: bool, end_of_stream: bool) -> tuple[bytes, bytes]:
    """The bytes before and after an ``n``-byte body: they depend only on its length and the two
    flags, and a token's chunk has one of a few hundred lengths, so they are built once each."""
    head = (_BODY_TAG + _varint(n)) if n else b""
    tail = _EOS if end_of_stream else b""
    size = len(head) + n + len(tail)
    for tag in reversed(_INNER_TAGS):  # only the length prefixes: the body is copied once
        prefix = tag + _varint(size)
        head = prefix + head
        size += len(prefix)
    outer = (_RESPONSE_TAG if response else _REQUEST_TAG) + _varint(size)
    return outer + head, tail


# A request-headers reply (the routed request's headers: the destination, the owned headers
# removed, the ``envoy.lb`` metadata), written by hand like the body replies: building it as
# protobuf objects, the metadata through ``Struct.update``, was a twentieth of a small request's
# CPU. Tags from the descriptors, as above.
_HEADERS_TAG = _len_tag(_field_number(pb.ProcessingResponse, "request_headers"))
_METADATA_TAG = _len_tag(_field_number(pb.ProcessingResponse, "dynamic_metadata"))
_COMMON_TAG = _len_tag(_field_number(pb.HeadersResponse, "response"))
_MUTATION_TAG = _len_tag(_field_number(pb.CommonResponse, "header_mutation"))
_CLEAR_ROUTE_CACHE = _varint(_field_number(pb.CommonResponse, "clear_route_cache") << 3) + b"\x01"
_SET_TAG = _len_tag(_field_number(pb.HeaderMutation, "set_headers"))
_REMOVE_TAG = _len_tag(_field_number(pb.HeaderMutation, "remove_headers"))
_OPTION_HEADER_TAG = _len_tag(_field_number(pb.HeaderValueOption, "header"))
_OVERWRITE_ACTION = _varint(_field_number(pb.HeaderValueOption, "append_action") << 3) + _varint(
    _OVERWRITE
)
_KEY_TAG = _len_tag(_field_number(pb.HeaderValue, "key"))
_RAW_VALUE_TAG = _len_tag(_field_number(pb.HeaderValue, "raw_value"))
_STRUCT_FIELD_TAG = _len_tag(_field_number(struct_pb2.Struct, "fields"))
_ENTRY_KEY_TAG, _ENTRY_VALUE_TAG = _len_tag(1), _len_tag(2)  # a map entry: key 1, value 2
_NULL = _varint(_field_number(struct_pb2.Value, "null_value") << 3) + b"\x00"
_NUMBER = _varint(_field_number(struct_pb2.Value, "number_value") << 3 | 1)  # 64-bit
_STRING = _len_tag(_field_number(struct_pb2.Value, "string_value"))
_BOOL = _varint(_field_number(struct_pb2.Value, "bool_value") << 3)
_STRUCT = _len_tag(_field_number(struct_pb2.Value, "struct_value"))
_LIST = _len_tag(_field_number(struct_pb2.Value, "list_value"))
_LIST_ITEM_TAG = _len_tag(_field_number(struct_pb2.ListValue, "values"))
_DOUBLE = struct.Struct("<d")


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def _struct_fields(values: Mapping[str, Any]) -> bytes:
    """A ``google.protobuf.Struct`` of ``values`` as ``Struct.update`` builds it."""
    out = []
    for k, v in values.items():
        value = _delimited(_STRING, v.encode()) if type(v) is str else _value(v)
        entry = _delimited(_ENTRY_KEY_TAG, k.encode()) + _delimited(_ENTRY_VALUE_TAG, value)
        out.append(_delimited(_STRUCT_FIELD_TAG, entry))
    return b"".join(out)


def _value(v: Any) -> bytes:
    """A ``google.protobuf.Value`` (its oneof always written: ``0``, ``""`` and ``False`` too)."""
    if isinstance(v, str):
        return _delimited(_STRING, v.encode())
    if isinstance(v, bool):
        return _BOOL + (b"\x01" if v else b"\x00")
    if isinstance(v, int | float):
        return _NUMBER + _DOUBLE.pack(v)
    if v is None:
        return _NULL
    if isinstance(v, Mapping):
        return _delimited(_STRUCT, _struct_fields(v))
    if isinstance(v, list | tuple):
        return _delimited(_LIST, b"".join(_delimited(_LIST_ITEM_TAG, _value(x)) for x in v))
    raise TypeError(f"no google.protobuf.Value for {type(v).__name__}")


@functools.lru_cache(maxsize=256)
def _header_key(key: str) -> bytes:
    return _delimited(_KEY_TAG, key.encode())


def _set_header(key: str, value: str) -> bytes:
    header = _header_key(key) + _delimited(_RAW_VALUE_TAG, value.encode())
    return _delimited(_SET_TAG, _delimited(_OPTION_HEADER_TAG, header) + _OVERWRITE_ACTION)


@functools.lru_cache(maxsize=256)
def _removals(remove: tuple[str, ...], set_keys: tuple[str, ...]) -> bytes:
    """The removals, less the headers being set: the same few combinations on every request."""
    return b"".join(_delimited(_REMOVE_TAG, h.encode()) for h in remove if h not in set_keys)


def encoded_headers_reply(
    set_headers: Mapping[str, str], remove: Sequence[str], metadata: Mapping[str, Any] | None
) -> bytes:
    """``request_headers_reply(set_headers, remove, metadata).SerializeToString()``, a message
    that parses to the same, written directly (a value ``Struct`` cannot hold raises
    ``TypeError``, as ``Struct.update`` raises ``ValueError``)."""
    parts = [_set_header(k, v) for k, v in set_headers.items()]
    parts.append(_removals(tuple(remove), tuple(set_headers)))
    common = _delimited(_MUTATION_TAG, b"".join(parts)) + _CLEAR_ROUTE_CACHE
    out = _delimited(_HEADERS_TAG, _delimited(_COMMON_TAG, common))
    if metadata:
        out += _delimited(_METADATA_TAG, _struct_fields({wire.LB_NAMESPACE: metadata}))
    return out


# A response body chunk, decoded by hand: ``ProcessingRequest{response_body: HttpBody{body,
# end_of_stream}}`` is one message per streamed token, and protobuf's decode with the oneof and
# field lookups after it cost more than reading its few bytes here. Anything else, or the same
# message written another way (another field, a repeated one, fields out of order, a long
# varint), is left to protobuf. Tags from the descriptors, as above.
_CHUNK_TAG: Final = _len_tag(_field_number(pb.ProcessingRequest, "response_body"))[0]
_CHUNK_BODY_TAG: Final = _len_tag(_field_number(pb.HttpBody, "body"))[0]
_CHUNK_EOS_TAG: Final = _varint(_field_number(pb.HttpBody, "end_of_stream") << 3)[0]


def _varint_at(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ``(-1, pos)`` if it does not end within
    ``data`` or runs past four bytes (never for a message under 256 MB). ``response_chunk``
    reads the usual one-byte lengths itself and calls this for the longer ones."""
    value = shift = 0
    for i in range(pos, min(pos + 4, len(data))):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


def response_chunk(data: bytes) -> tuple[bytes, bool] | None:
    """``(body, end_of_stream)`` when ``data`` is a serialized ``ProcessingRequest`` holding
    only a ``response_body`` (its ``body``, then its ``end_of_stream``, each optional), as
    Envoy writes it; ``None`` for anything else, which protobuf then decodes."""
    end = len(data)
    if end < 2 or data[0] != _CHUNK_TAG:
        return None
    size = data[1]  # the usual one-byte lengths are read inline, without ``_varint_at``
    pos = 2
    if size >= 0x80:
        size, pos = _varint_at(data, 1)
    if pos + size != end:  # another field follows, the message is cut short, or a bad varint
        return None
    body = b""
    if pos < end and data[pos] == _CHUNK_BODY_TAG:
        size = data[pos + 1] if pos + 1 < end else 0x80
        if size < 0x80:
            pos += 2
        else:
            size, pos = _varint_at(data, pos + 1)
            if size < 0:
                return None
        if pos + size > end:
            return None
        body = data[pos : pos + size]
        pos += size
    if pos == end:
        return body, False
    if pos + 2 == end and data[pos] == _CHUNK_EOS_TAG and data[pos + 1] < 2:
        return body, data[pos + 1] == 1
    return None


Reply: TypeAlias = "pb.ProcessingResponse | bytes"
"""A reply as a message, or already serialized (``encode`` turns either into bytes)."""


def encode(reply: Reply) -> bytes:
    return reply if isinstance(reply, bytes) else reply.SerializeToString()


def http_status(code: int) -> pb.HttpStatus:
    """Any HTTP status: Envoy's ``StatusCode`` names the usual ones, and as a proto3 enum it
    carries any other number too."""
    return pb.HttpStatus(code=cast(pb.StatusCode, code))


def immediate(err: InferenceError) -> pb.ProcessingResponse:
    headers = dict(err.headers)
    headers.setdefault("content-type", "text/plain; charset=utf-8")
    if err.drop_reason:
        headers[wire.DROPPED_REASON_HEADER] = err.drop_reason
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status(err.code.http_status),
            headers=mutation(headers),
            body=err.body.encode(),
            details=err.code.label,
        )
    )


def evicted(err: InferenceError) -> pb.ProcessingResponse:
    """Upstream's reply to an in-flight request flow control evicted: its status (429), the raw
    message as body (no "inference error:" prefix) and the dropped-reason header."""
    headers = {wire.DROPPED_REASON_HEADER: err.drop_reason} if err.drop_reason else {}
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status(err.code.http_status),
            headers=mutation(headers),
            body=err.message.encode(),
            details=err.code.label,
        )
    )


def _response_headers(set_headers: Mapping[str, str]) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=mutation(set_headers))
        )
    )


_WENT_INTO: Final = MappingProxyType({wire.WENT_INTO_RESP_HEADERS: "true"})
_WENT_INTO_REPLY: Final[bytes] = _response_headers(_WENT_INTO).SerializeToString()


def response_headers_reply(
    set_headers: Mapping[str, str], *, skip_body: BodyMode | None = None
) -> Reply:
    """The response-headers reply; the common one (no response-headers hook set a header) is
    serialized once, as it is on every response's first-token path. ``skip_body``: the request
    body mode the stream was configured with; the reply then asks Envoy not to send the response
    body (``skip_body_override``)."""
    if skip_body is not None:
        if set_headers == _WENT_INTO:
            return _skip_body_reply(skip_body)
        reply = _response_headers(set_headers)
        skip_body_override(reply, skip_body)
        return reply
    if set_headers == _WENT_INTO:
        return _WENT_INTO_REPLY
    return _response_headers(set_headers)


def skip_body_override(reply: pb.ProcessingResponse, request_body_mode: BodyMode) -> None:
    """Set ``mode_override`` to ``{request_body_mode, response_body_mode: NONE}``: the header and
    trailer modes stay DEFAULT, which Envoy (1.34 and later) reads as unchanged, and the request
    body mode is the configured one (the request is over; it matters only to an
    ``allowed_override_modes`` list, which Envoy compares with the mode this override results in,
    every field spelled out)."""
    mode = reply.mode_override
    mode.SetInParent()
    mode.request_body_mode = request_body_mode
    mode.response_body_mode = pb.ProcessingMode.NONE


@functools.lru_cache(maxsize=8)
def _skip_body_reply(request_body_mode: BodyMode) -> bytes:
    reply = _response_headers(_WENT_INTO)
    skip_body_override(reply, request_body_mode)
    return encode(reply)


def buffered_response_body_reply(body: bytes | None) -> pb.ProcessingResponse:
    common = pb.CommonResponse()
    if body is not None:
        common.body_mutation.body = body
    return pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))


def with_dynamic_metadata(reply: Reply, metadata: Mapping[str, Mapping[str, Any]]) -> Reply:
    """``reply`` carrying ``metadata`` (namespace → fields) as its dynamic metadata. A reply
    already serialized gets a serialized ``dynamic_metadata`` field appended: protobuf merges the
    two, so the bytes are those of one message with both."""
    struct = struct_pb2.Struct()
    struct.update({namespace: dict(fields) for namespace, fields in metadata.items()})
    if isinstance(reply, bytes):
        extra: bytes = pb.ProcessingResponse(dynamic_metadata=struct).SerializeToString()
        return reply + extra
    out = pb.ProcessingResponse()
    out.CopyFrom(reply)  # replies may be shared constants
    out.dynamic_metadata.MergeFrom(struct)
    return out


def trailers_reply(metadata: Mapping[str, Any]) -> pb.ProcessingResponse:
    """Request trailers answered with the decision as ``envoy.lb`` metadata (the body replies of
    a per-chunk body mode already went out, so no header mutation can carry it any more)."""
    resp = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
    resp.dynamic_metadata.CopyFrom(lb_metadata(metadata))
    return resp


EMPTY_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
EMPTY_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
EMPTY_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
