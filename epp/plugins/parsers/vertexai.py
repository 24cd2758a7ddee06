"""``vertexai-parser``: Vertex AI's ``PredictionService`` over gRPC (h2c), the methods that carry
an OpenAI-compatible JSON body in a ``google.api.HttpBody``.

Claimed path suffixes (a gRPC path ``/google.cloud.aiplatform.v1.PredictionService/<Method>``,
``v1beta1`` alike, matches by the service's unqualified name, see ``epp.plugin.paths``)::

    PredictionService/ChatCompletions    ChatCompletionsRequest   -> kind "chat"
    PredictionService/RawPredict         RawPredictRequest        -> kind "responses"
    PredictionService/StreamRawPredict   StreamRawPredictRequest  -> kind "responses", streamed

Request: the body is one uncompressed gRPC message (``epp.plugins.parsers.grpcwire``) holding the
request (``endpoint`` = 1, ``http_body`` = 2; schema ``proto/epp/vertexai/v1/prediction.proto``).
``http_body.data`` is decoded and validated as the OpenAI API of its method, exactly as
``openai-parser`` does (chat: at least one message; responses: an ``input``), which gives
``model``, ``stream``, the output cap, ``cache_salt`` and prompt token ids; ``RequestBody.raw``
stays the gRPC body, which is forwarded untouched (no model rewrite). ``StreamRawPredict`` is a
server-streaming method, so its answer is treated as a stream whatever the JSON says. Anything
else is a 400 that names the method: a body too short for a gRPC frame, a compressed message, a
length past the end, malformed protobuf, a request without ``http_body``, or JSON the OpenAI
rules refuse. Another method of the service reaching the parser (it claims only these three) is
forwarded raw with ``skip_response_processing``.

Responses: every gRPC message of the answer is an ``HttpBody``; their ``data`` in order is the
OpenAI answer (one JSON object, or server-sent events, per ``HttpBody.content_type``; one event
may span messages), read with the OpenAI usage dialect (``epp.plugins.parsers.usage``). A
compressed response message is skipped.

Parameters: none. Claims the ``kubernetes.io/h2c`` app protocol only. Example::

    requestHandler:
      parsers:
      - pluginRef: vertexai-parser
    plugins:
    - type: vertexai-parser
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Final

from epp._proto import epp_vertexai_v1_pb2 as vertex
from epp.plugin import (
    APP_PROTOCOL_H2C,
    InferenceError,
    ParsedResponse,
    ParseResult,
    RequestBody,
)
from epp.plugin.paths import SuffixTable, strip_query
from epp.plugins.parsers.common import ParserBase, bad_request
from epp.plugins.parsers.grpcwire import FrameReader, decode, request_message, try_decode
from epp.plugins.parsers.openai import parse_openai_body
from epp.plugins.parsers.usage import OpenAIDialect, ResponseUsageState

CHAT_COMPLETIONS: Final = "PredictionService/ChatCompletions"
RAW_PREDICT: Final = "PredictionService/RawPredict"
STREAM_RAW_PREDICT: Final = "PredictionService/StreamRawPredict"
CLAIMS: tuple[str, ...] = (CHAT_COMPLETIONS, STREAM_RAW_PREDICT, RAW_PREDICT)

_Request = (
    type[vertex.ChatCompletionsRequest]
    | type[vertex.RawPredictRequest]
    | type[vertex.StreamRawPredictRequest]
)
# method -> (request message, OpenAI API of its JSON, always streamed)
_METHODS: SuffixTable[tuple[_Request, str, bool]] = SuffixTable(
    [
        (CHAT_COMPLETIONS, (vertex.ChatCompletionsRequest, "chat", False)),
        (RAW_PREDICT, (vertex.RawPredictRequest, "responses", False)),
        (STREAM_RAW_PREDICT, (vertex.StreamRawPredictRequest, "responses", True)),
    ]
)


def _fold(into: ParsedResponse, parsed: ParsedResponse) -> None:
    if parsed.usage is not None:
        if into.usage is None:
            into.usage = parsed.usage
        else:
            into.usage.merge(parsed.usage)
    into.streamed_events += parsed.streamed_events
    into.response_id = into.response_id or parsed.response_id


class VertexResponseState:
    """Usage of one answer: its ``HttpBody`` messages' data, fed in order to an OpenAI usage
    reader (created at the first message, for its content type)."""

    __slots__ = ("_frames", "_inner")

    def __init__(self) -> None:
        self._frames = FrameReader()
        self._inner: ResponseUsageState | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        out = ParsedResponse()
        for payload in self._frames.feed(chunk):
            body = try_decode(vertex.HttpBody, payload)
            if body is None or not body.data:
                continue
            if self._inner is None:
                content_type = {"content-type": body.content_type} if body.content_type else {}
                self._inner = ResponseUsageState(OpenAIDialect, content_type)
            _fold(out, self._inner.feed(body.data, False))
        if end_of_stream and self._inner is not None:
            _fold(out, self._inner.feed(b"", True))
        return out


class VertexAIParser(ParserBase):
    """Parser for Vertex AI's ``PredictionService`` (gRPC); see the module docstring."""

    TYPE: ClassVar[str] = "vertexai-parser"
    supports_model_rewrite: ClassVar[bool] = False

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C,)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        method = _METHODS.lookup(strip_query(path))
        if method is None:
            return ParseResult(
                model="",
                body=RequestBody(kind="raw", payload=None, raw=body),
                skip_response_processing=True,
            )
        message_type, kind, streamed = method
        name = message_type.DESCRIPTOR.name
        where = f"invalid Vertex AI {name}: "
        request = decode(message_type, request_message(body, where), where)
        if not request.HasField("http_body"):
            raise bad_request(f"{where}http_body is missing")
        try:
            inner = parse_openai_body(kind, request.http_body.data)
        except InferenceError as exc:
            raise bad_request(f"{where}{exc.message}") from None
        parsed = dataclasses.replace(inner.body, raw=body, stream=inner.body.stream or streamed)
        return ParseResult(model=inner.model, body=parsed)

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        # The JSON sits inside a protobuf message: the body is forwarded as it came.
        return body.raw

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return VertexResponseState().feed(chunk, True)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> VertexResponseState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return VertexResponseState()
