"""Our ext_proc schema (``proto/epp/extproc/v3``) is Envoy's wire format.

Every field we declare has Envoy's number, type, label and oneof; every field of Envoy's message
we leave out is ``reserved``; every enum value is Envoy's. Envoy's side is read from
``envoy-data-plane`` (typed Envoy messages, a dependency of ``epp envoy-config``), an independent
rendering of Envoy's API. Then the bytes: messages the EPP builds parse as Envoy's messages with
the same values, and Envoy's messages parse as ours.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from types import ModuleType
from typing import Any

import pytest
from envoy_data_plane.envoy.config.core import v3 as core
from envoy_data_plane.envoy.extensions.filters.http.ext_proc import v3 as mode
from envoy_data_plane.envoy.service.ext_proc import v3 as ext_proc
from envoy_data_plane.envoy.type import v3 as http_type
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import ErrorCode, InferenceError, wire
from epp.server import messages

ENVOY: tuple[ModuleType, ...] = (ext_proc, mode, core, http_type)
KIND = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_ENUM: "enum",
    FieldDescriptor.TYPE_MESSAGE: "message",
}


def envoy_class(name: str) -> Any:
    """Envoy's class for one of our messages or enums (nested names are flattened there)."""
    (found,) = [getattr(m, name) for m in ENVOY if hasattr(m, name)]
    return found


def flat(d: Descriptor | EnumDescriptor) -> str:
    """``epp.extproc.v3.ProcessingMode.BodySendMode`` → ``ProcessingModeBodySendMode``."""
    return d.full_name.removeprefix(f"{pb.DESCRIPTOR.package}.").replace(".", "")


def reserved(message: str) -> set[int]:
    fdp = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(fdp)
    (m,) = [m for m in fdp.message_type if m.name == message]
    return {n for r in m.reserved_range for n in range(r.start, r.end)}


MESSAGES = sorted(pb.DESCRIPTOR.message_types_by_name)


def test_the_schema_covers_what_the_epp_speaks() -> None:
    assert set(MESSAGES) >= {"ProcessingRequest", "ProcessingResponse", "ImmediateResponse"}
    assert pb.DESCRIPTOR.package == "epp.extproc.v3"  # never Envoy's: no clash in one process


@pytest.mark.parametrize("name", MESSAGES)
def test_every_field_is_envoys_and_every_other_envoy_field_is_reserved(name: str) -> None:
    ours = pb.DESCRIPTOR.message_types_by_name[name]
    theirs = {f.metadata["betterproto"].number: f for f in dataclasses.fields(envoy_class(name))}
    for field in ours.fields:
        assert field.number in theirs, f"{name}.{field.name}: Envoy has no field {field.number}"
        env = theirs[field.number]
        meta = env.metadata["betterproto"]
        assert field.name == env.name
        oneof = field.containing_oneof.name if field.containing_oneof else None
        assert oneof == meta.group, f"{name}.{field.name}"
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert meta.proto_type == "map", f"{name}.{field.name}"
            value = field.message_type.fields_by_name["value"]
            assert value.message_type is not None
            assert re.search(rf"\b{value.message_type.name}\]", str(env.type)), env.type
            continue
        assert KIND[field.type] == meta.proto_type, f"{name}.{field.name}"
        assert field.is_repeated == meta.repeated, f"{name}.{field.name}"
        typed = field.message_type or field.enum_type
        if typed is not None:
            short = typed.name if typed.file.package == "google.protobuf" else flat(typed)
            assert re.search(rf"\b{short}\b", str(env.type)), (name, field.name, env.type)
    left_out = set(theirs) - {f.number for f in ours.fields}
    assert reserved(name) >= left_out, f"{name}: reserve Envoy's fields {left_out}"


def _enums() -> list[EnumDescriptor]:
    out = list(pb.DESCRIPTOR.enum_types_by_name.values())
    for m in pb.DESCRIPTOR.message_types_by_name.values():
        out.extend(m.enum_types)
    return out


@pytest.mark.parametrize("ours", _enums(), ids=flat)
def test_every_enum_value_is_envoys(ours: EnumDescriptor) -> None:
    theirs: type[enum.Enum] = envoy_class(flat(ours))
    assert {v.name: v.number for v in ours.values} == {e.name: e.value for e in theirs}


def _headers() -> pb.HttpHeaders:
    values = [pb.HeaderValue(key=":path", raw_value=b"/v1/completions"), pb.HeaderValue(key="a")]
    return pb.HttpHeaders(headers=pb.HeaderMap(headers=values), end_of_stream=True)


def test_requests_as_envoy_sends_them_read_the_same_in_our_schema() -> None:
    served = {wire.LB_NAMESPACE: {wire.SERVED_HEADER: "1.2.3.4:8"}}
    metadata = core.Metadata.from_dict({"filterMetadata": served})
    sent = ext_proc.ProcessingRequest(
        request_body=ext_proc.HttpBody(body=b"{}", end_of_stream=True),
        metadata_context=metadata,
        protocol_config=ext_proc.ProtocolConfiguration(
            request_body_mode=mode.ProcessingModeBodySendMode.BUFFERED,
            response_body_mode=mode.ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED,
        ),
        observability_mode=True,  # a field we leave out: kept, not an error
    )
    got = pb.ProcessingRequest.FromString(bytes(sent))
    assert (got.request_body.body, got.request_body.end_of_stream) == (b"{}", True)
    assert got.protocol_config.request_body_mode == pb.ProcessingMode.BUFFERED
    assert got.protocol_config.response_body_mode == pb.ProcessingMode.FULL_DUPLEX_STREAMED
    assert messages.served_endpoint(got) == "1.2.3.4:8"
    assert ext_proc.ProcessingRequest.parse(got.SerializeToString()) == sent
    ours = pb.ProcessingRequest(response_headers=_headers())
    back = ext_proc.ProcessingRequest.parse(ours.SerializeToString())
    assert back.response_headers is not None and back.response_headers.end_of_stream
    assert back.response_headers.headers is not None
    assert [(h.key, h.raw_value) for h in back.response_headers.headers.headers] == [
        (":path", b"/v1/completions"),
        ("a", b""),
    ]


def test_the_epps_replies_read_as_envoys_messages() -> None:
    reply = messages.request_headers_reply({"x-dest": "10.0.0.1:8000"}, ["x-old"], {"k": "v"})
    got = ext_proc.ProcessingResponse.parse(reply.SerializeToString())
    assert got.request_headers is not None and got.request_headers.response is not None
    common = got.request_headers.response
    assert common.clear_route_cache
    assert common.header_mutation is not None
    (option,) = common.header_mutation.set_headers
    assert option.header is not None
    assert (option.header.key, option.header.raw_value) == ("x-dest", b"10.0.0.1:8000")
    overwrite = core.HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
    assert option.append_action == overwrite
    assert common.header_mutation.remove_headers == ["x-old"]
    assert got.dynamic_metadata is not None
    assert got.dynamic_metadata.to_dict() == {wire.LB_NAMESPACE: {"k": "v"}}

    (chunk,) = messages.streamed_body(b"data: 1", response=True)
    body = ext_proc.ProcessingResponse.parse(chunk).response_body
    assert body is not None and body.response is not None
    assert body.response.body_mutation is not None
    streamed = body.response.body_mutation.streamed_response
    assert streamed is not None and (streamed.body, streamed.end_of_stream) == (b"data: 1", True)

    err = InferenceError(ErrorCode.RESOURCE_EXHAUSTED, "busy", drop_reason="queue-full")
    immediate = ext_proc.ProcessingResponse.parse(messages.immediate(err).SerializeToString())
    answer = immediate.immediate_response
    assert answer is not None and answer.status is not None
    assert answer.status.code == http_type.StatusCode.TooManyRequests
    assert answer.details == err.code.label and b"busy" in answer.body


def test_a_status_outside_envoys_names_still_travels() -> None:
    status = messages.http_status(599)
    assert http_type.HttpStatus.parse(status.SerializeToString()).code == 599
