"""Replies serialized by hand are the bytes protobuf would give."""

from __future__ import annotations

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.plugin import wire
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
