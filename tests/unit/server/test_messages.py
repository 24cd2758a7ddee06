"""Replies serialized by hand are the bytes protobuf would give."""

from __future__ import annotations

import random

import pytest
from google.protobuf import json_format

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import ErrorCode, InferenceError, wire
from epp.server import messages


def by_protobuf(body: bytes, *, response: bool, end_of_stream: bool) -> bytes:
    common = pb.CommonResponse(
        body_mutation=pb.BodyMutation(
            streamed_response=pb.StreamedBodyResponse(body=body, end_of_stream=end_of_stream)
        )
    )
    if response:
        return pb.ProcessingResponse(
            response_body=pb.BodyResponse(response=common)
        ).SerializeToString()
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString()


@pytest.mark.parametrize("size", [0, 1, 100, 117, 118, 127, 128, 16_383, 16_384, 62_000])
@pytest.mark.parametrize("response", [True, False])
@pytest.mark.parametrize("eos", [True, False])
def test_encoded_body_is_what_protobuf_serializes(size: int, response: bool, eos: bool) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    got = messages.encoded_body(body, response=response, end_of_stream=eos)
    assert got == by_protobuf(body, response=response, end_of_stream=eos)


def test_streamed_body_splits_at_62000_bytes_with_eos_on_the_last_piece_only() -> None:
    body = b"a" * (2 * wire.MAX_BODY_CHUNK + 5)
    pieces = [
        pb.ProcessingResponse.FromString(r) for r in messages.streamed_body(body, response=True)
    ]
    streamed = [p.response_body.response.body_mutation.streamed_response for p in pieces]
    assert [len(s.body) for s in streamed] == [wire.MAX_BODY_CHUNK, wire.MAX_BODY_CHUNK, 5]
    assert [s.end_of_stream for s in streamed] == [False, False, True]
    (empty,) = messages.streamed_body(b"", response=False, end_of_stream=False)
    assert pb.ProcessingResponse.FromString(empty).HasField("request_body")


def test_encode_passes_bytes_on_and_serializes_messages() -> None:
    assert messages.encode(b"\x01") == b"\x01"
    assert messages.encode(messages.EMPTY_REQUEST_BODY) == b"\x1a\x00"


def test_header_map_lowercases_keys_and_prefers_raw_value() -> None:
    headers = pb.HttpHeaders(
        headers=pb.HeaderMap(
            headers=[
                pb.HeaderValue(key="X-Raw", raw_value=b"caf\xc3\xa9 \xff"),
                pb.HeaderValue(key="X-Plain", value="v"),
            ]
        )
    )
    assert messages.header_map(headers) == {"x-raw": "café \ufffd", "x-plain": "v"}


def test_metadata_namespaces_returns_only_the_asked_namespaces() -> None:
    assert messages.metadata_namespaces(pb.ProcessingRequest(), ["a"]) == {}
    request = pb.ProcessingRequest()
    fm = request.metadata_context.filter_metadata
    fm["a"].update({"x": ["1.2.3.4:80"]})
    fm["b"].update({"y": 1})
    assert messages.metadata_namespaces(request, ["a", "c"]) == {"a": {"x": ["1.2.3.4:80"]}}


def set_of(mutation: pb.HeaderMutation) -> dict[str, bytes]:
    actions = {o.append_action for o in mutation.set_headers}
    assert actions <= {pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD}
    return {o.header.key: o.header.raw_value for o in mutation.set_headers}


def test_mutation_overwrites_and_removes_only_what_it_does_not_set() -> None:
    got = messages.mutation({"a": "1", "b": "é"}, ["a", "c"])
    assert set_of(got) == {"a": b"1", "b": "é".encode()}
    assert list(got.remove_headers) == ["c"]
    assert not [o for o in got.set_headers if o.header.value]  # raw_value only


def test_request_headers_reply_carries_headers_metadata_and_route_cache_flag() -> None:
    got = messages.request_headers_reply({"x-d": "1.1.1.1:8"}, ["x-o"], {"x-d": "1.1.1.1:8"})
    common = got.request_headers.response
    assert common.clear_route_cache and set_of(common.header_mutation) == {"x-d": b"1.1.1.1:8"}
    assert list(common.header_mutation.remove_headers) == ["x-o"]
    assert json_format.MessageToDict(got.dynamic_metadata) == {
        wire.LB_NAMESPACE: {"x-d": "1.1.1.1:8"}
    }
    bare = messages.request_headers_reply({}, [], None, clear_route_cache=False)
    assert not bare.request_headers.response.clear_route_cache
    assert not bare.HasField("dynamic_metadata")


def test_buffered_body_reply_rewrites_the_body_only_when_given() -> None:
    got = messages.buffered_body_reply({"x-d": "h:1"}, ["x-o"], {"x-d": "h:1"}, b"new")
    common = got.request_body.response
    assert common.clear_route_cache and common.body_mutation.body == b"new"
    assert set_of(common.header_mutation) == {"x-d": b"h:1"}
    assert list(common.header_mutation.remove_headers) == ["x-o"]
    assert json_format.MessageToDict(got.dynamic_metadata) == {wire.LB_NAMESPACE: {"x-d": "h:1"}}
    kept = messages.buffered_body_reply({}, [], None, None)
    assert not kept.request_body.response.HasField("body_mutation")
    assert not kept.HasField("dynamic_metadata")


def test_immediate_reply_has_status_text_body_and_drop_reason() -> None:
    err = InferenceError(
        ErrorCode.SERVICE_UNAVAILABLE, "no pods", drop_reason="rejected-no-endpoints"
    )
    got = messages.immediate(err).immediate_response
    assert got.status.code == 503 and got.details == "ServiceUnavailable"
    assert got.body == b"inference error: ServiceUnavailable - no pods"
    assert set_of(got.headers) == {
        "content-type": b"text/plain; charset=utf-8",
        wire.DROPPED_REASON_HEADER: b"rejected-no-endpoints",
    }
    own = InferenceError(ErrorCode.BAD_REQUEST, "x", headers={"content-type": "application/json"})
    assert set_of(messages.immediate(own).immediate_response.headers) == {
        "content-type": b"application/json"
    }


def test_evicted_reply_is_the_raw_message_with_the_drop_reason() -> None:
    err = InferenceError(
        ErrorCode.RESOURCE_EXHAUSTED, "request evicted by flow control", drop_reason="evicted"
    )
    got = messages.evicted(err).immediate_response
    assert (got.status.code, got.details) == (429, "ResourceExhausted")
    assert got.body == b"request evicted by flow control"
    assert set_of(got.headers) == {wire.DROPPED_REASON_HEADER: b"evicted"}
    plain = InferenceError(ErrorCode.RESOURCE_EXHAUSTED, "gone")
    assert set_of(messages.evicted(plain).immediate_response.headers) == {}


def test_response_replies() -> None:
    headers = messages.response_headers_reply({"x-served": "a"})
    assert set_of(headers.response_headers.response.header_mutation) == {"x-served": b"a"}
    body = messages.buffered_response_body_reply(b"changed")
    assert body.response_body.response.body_mutation.body == b"changed"
    same = messages.buffered_response_body_reply(None)
    assert same.HasField("response_body") and not same.response_body.response.HasField(
        "body_mutation"
    )
    trailers = messages.trailers_reply({"x-d": "h:1"})
    assert trailers.HasField("request_trailers")
    assert json_format.MessageToDict(trailers.dynamic_metadata) == {
        wire.LB_NAMESPACE: {"x-d": "h:1"}
    }


@pytest.mark.parametrize(
    ("size", "pieces"),
    [(62_000, [62_000]), (62_001, [62_000, 1]), (124_000, [62_000, 62_000])],
)
@pytest.mark.parametrize("eos", [True, False])
def test_streamed_body_pieces_at_the_chunk_limit(size: int, pieces: list[int], eos: bool) -> None:
    body = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    got = [
        pb.ProcessingResponse.FromString(r).request_body.response.body_mutation.streamed_response
        for r in messages.streamed_body(body, response=False, end_of_stream=eos)
    ]
    assert [len(s.body) for s in got] == pieces and b"".join(s.body for s in got) == body
    assert [s.end_of_stream for s in got] == [False] * (len(pieces) - 1) + [eos]


def _with_lb(values: dict[str, object] | None) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(response_headers=pb.HttpHeaders())
    if values is not None:
        msg.metadata_context.filter_metadata[wire.LB_NAMESPACE].update(values)
    return msg


@pytest.mark.parametrize(
    ("values", "served"),
    [
        pytest.param(None, "", id="no-metadata"),
        pytest.param({"other": "x"}, "", id="no-served-key"),
        pytest.param({wire.SERVED_HEADER: "10.0.0.1:8000"}, "10.0.0.1:8000", id="string"),
        pytest.param({wire.SERVED_HEADER: 8000}, "8000.0", id="number"),
        pytest.param({wire.SERVED_HEADER: True}, "True", id="bool"),
    ],
)
def test_served_endpoint_reads_what_the_namespace_conversion_read(
    values: dict[str, object] | None, served: str
) -> None:
    msg = _with_lb(values)
    assert messages.served_endpoint(msg) == served
    converted = messages.metadata_namespaces(msg, (wire.LB_NAMESPACE,))
    lb = converted.get(wire.LB_NAMESPACE, {})
    assert str(lb.get(wire.SERVED_HEADER, "")) == served
    other = pb.ProcessingRequest(response_headers=pb.HttpHeaders())
    other.metadata_context.filter_metadata["elsewhere"].update({wire.SERVED_HEADER: "x"})
    assert messages.served_endpoint(other) == ""


@pytest.mark.parametrize(
    "set_headers",
    [
        pytest.param({wire.WENT_INTO_RESP_HEADERS: "true"}, id="common"),
        pytest.param({wire.WENT_INTO_RESP_HEADERS: "true", "x-hook": "1"}, id="hook-added"),
        pytest.param({}, id="none"),
    ],
)
def test_response_headers_reply_is_the_same_bytes_whether_prebuilt_or_not(
    set_headers: dict[str, str],
) -> None:
    reply = messages.encode(messages.response_headers_reply(set_headers))
    got = pb.ProcessingResponse.FromString(reply)
    mutation = got.response_headers.response.header_mutation
    assert {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers} == set_headers
    assert reply == messages._response_headers(set_headers).SerializeToString()


def _random_value(rng: random.Random, depth: int) -> object:
    kinds = ["str", "int", "float", "bool", "none"] + (["dict", "list"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return "".join(rng.choice("aé:./- 0") for _ in range(rng.randrange(0, 200)))
    if kind == "int":
        return rng.randrange(-(10**6), 10**6)
    if kind == "float":
        return rng.uniform(-1e9, 1e9)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "dict":
        return {f"k{i}": _random_value(rng, depth + 1) for i in range(rng.randrange(0, 4))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]


def test_encoded_headers_reply_parses_to_what_protobuf_builds() -> None:
    rng = random.Random(7)
    for _ in range(300):
        set_headers = {
            f"x-h{i}": "".join(rng.choice("ab:é1") for _ in range(rng.randrange(0, 300)))
            for i in range(rng.randrange(0, 5))
        }
        remove = [f"x-h{i}" for i in range(rng.randrange(0, 7))]
        metadata = (
            None
            if rng.random() < 0.2
            else {f"m{i}": _random_value(rng, 0) for i in range(rng.randrange(0, 3))}
        )
        got = pb.ProcessingResponse.FromString(
            messages.encoded_headers_reply(set_headers, remove, metadata)
        )
        assert got == messages.request_headers_reply(set_headers, remove, metadata)


def test_encoded_headers_reply_is_byte_for_byte_the_routed_reply() -> None:
    dest = {wire.DESTINATION_HEADER: "10.0.0.7:8000"}
    headers = {**dest, "content-length": "312", wire.REQUEST_ID_HEADER: "r-1"}
    owned = wire.OWNED_REQUEST_HEADERS
    want = messages.request_headers_reply(headers, owned, dest).SerializeToString()
    assert messages.encoded_headers_reply(headers, owned, dest) == want


def test_encoded_headers_reply_refuses_what_a_struct_cannot_hold() -> None:
    with pytest.raises(TypeError):
        messages.encoded_headers_reply({}, [], {"k": object()})


@pytest.mark.parametrize("size", [0, 1, 96, 127, 128, 16_383, 16_384, 70_000])
@pytest.mark.parametrize("eos", [False, True])
def test_response_chunk_reads_what_protobuf_reads(size: int, eos: bool) -> None:
    body = bytes(random.Random(size).randrange(256) for _ in range(size))
    data = pb.ProcessingRequest(
        response_body=pb.HttpBody(body=body, end_of_stream=eos)
    ).SerializeToString()
    assert messages.response_chunk(data) == (body, eos)


def _chunk_like() -> list[bytes]:
    """Messages that are not a lone response body chunk as Envoy writes it, or are one written
    another way: each must be left to protobuf (``None``) or read exactly as protobuf reads it."""
    plain = pb.ProcessingRequest(response_body=pb.HttpBody(body=b"data: x\n\n", end_of_stream=True))
    raw = plain.SerializeToString()
    inner = raw[2:]
    with_meta = pb.ProcessingRequest()
    with_meta.CopyFrom(plain)
    with_meta.metadata_context.filter_metadata["envoy.lb"].update({"a": "b"})
    with_config = pb.ProcessingRequest()
    with_config.CopyFrom(plain)
    with_config.protocol_config.response_body_mode = pb.ProcessingMode.FULL_DUPLEX_STREAMED
    eos_first = b"\x10\x01\x0a\x09data: x\n\n"
    return [
        b"",
        b"\x2a",
        raw[:-1],  # cut short
        raw + b"\x00",
        raw + raw,  # the field twice: protobuf merges
        with_meta.SerializeToString(),
        with_config.SerializeToString(),
        b"\x2a" + bytes([len(eos_first)]) + eos_first,  # fields out of order
        b"\x2a\x02\x10\x02",  # end_of_stream = 2 (true, written oddly)
        b"\x2a\x03\x10\x81\x00",  # a two-byte varint for 1
        b"\x2a\x00",  # an empty body message
        b"\x2a\x02\x0a\x00",  # an empty body written out
        b"\x2a\x80\x80\x80\x80\x01",  # a length varint longer than four bytes
        b"\x2a\xff\xff\xff\x7f",  # a length far past the end
        b"\x2a\x05\x0a\x09abc",  # the body's length past the message's end
        bytes([0x22, len(inner)]) + inner,  # a request body, not a response body
        b"\x2a\x04\x18\x01\x10\x01",  # an unknown field inside
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(end_of_stream=True)
        ).SerializeToString(),
    ]


@pytest.mark.parametrize("data", _chunk_like())
def test_response_chunk_leaves_every_other_shape_to_protobuf(data: bytes) -> None:
    got = messages.response_chunk(data)
    if got is None:
        return
    msg = pb.ProcessingRequest.FromString(data)
    assert msg.WhichOneof("request") == "response_body"
    assert not msg.HasField("metadata_context") and not msg.HasField("protocol_config")
    assert got == (msg.response_body.body, msg.response_body.end_of_stream)
    assert [f.name for f, _ in msg.ListFields()] == ["response_body"]


def test_response_chunk_agrees_with_protobuf_on_random_bytes() -> None:
    rng = random.Random(7)
    seen = 0
    for _ in range(20_000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12)))
        data = bytes([0x2A, len(body)]) + body if rng.random() < 0.7 else body
        got = messages.response_chunk(data)
        if got is None:
            continue
        seen += 1
        msg = pb.ProcessingRequest.FromString(data)
        assert got == (msg.response_body.body, msg.response_body.end_of_stream)
        assert msg.WhichOneof("request") == "response_body"
    assert seen > 100
