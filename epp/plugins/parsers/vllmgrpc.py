"""``vllmgrpc-parser``: vLLM's gRPC engine service (``vllm.grpc.engine.VllmEngine``) over h2c.

Claimed path suffixes::

    vllm.grpc.engine.VllmEngine/Generate   GenerateRequest -> kind "completions"
    vllm.grpc.engine.VllmEngine/Embed      EmbedRequest    -> kind "embeddings"

Request: the body is one uncompressed gRPC message (``epp.plugins.parsers.grpcwire``: a 1-byte
compressed flag that must be 0, a 4-byte big-endian length, the protobuf), decoded with our schema
of vLLM's messages (``proto/epp/vllmgrpc/v1/engine.proto``, vLLM's field numbers).

* ``Generate``: the prompt is ``tokenized.input_ids`` (non-empty; ``RequestBody.token_ids``) or
  ``text`` (non-empty), given to the framework as a completions request: payload
  ``{"prompt": <text or ids>}``, so producers see it as an OpenAI completion's prompt.
  ``stream`` and ``sampling_params.max_tokens`` (when set) are extracted.
* ``Embed``: ``tokenized.input_ids`` is required and non-empty; payload ``{"input": <ids>}``.

The model is "" (the API names none) and the body is forwarded byte for byte (no model rewrite).
Another method of the service reaching the parser (``HealthCheck``, ``Abort``, ``GetModelInfo``...;
only the two above are claimed) is forwarded raw with ``skip_response_processing``. Errors are 400s
naming the method: a body too short for a gRPC frame, a compressed message, a length past the
end, bytes after the message, malformed protobuf, a missing or empty prompt.

Responses: each gRPC message of the answer is read as a ``GenerateResponse``: ``chunk`` or
``complete`` ``.{prompt_tokens, completion_tokens, cached_tokens}`` (counted when prompt or
completion tokens are non-zero; a stream's chunks carry running totals, so the last one wins),
else as an ``EmbedResponse`` (``prompt_tokens``). A message that is a ``GenerateResponse`` has
nothing outside its fields (an ``EmbedResponse``'s fields would be unknown to it), which tells
the two apart. Malformed or compressed messages are skipped; nothing raises.

Parameters: none. Claims the ``kubernetes.io/h2c`` app protocol only. Example::

    requestHandler:
      parsers:
      - pluginRef: vllmgrpc-parser
    plugins:
    - type: vllmgrpc-parser
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Final

from google.protobuf.unknown_fields import UnknownFieldSet

from epp._proto import epp_vllmgrpc_v1_pb2 as vllm
from epp.plugin import APP_PROTOCOL_H2C, ParsedResponse, ParseResult, RequestBody, Usage
from epp.plugin.paths import SuffixTable, strip_query
from epp.plugins.parsers.common import ParserBase, bad_request
from epp.plugins.parsers.grpcwire import FrameReader, decode, request_message, try_decode

SERVICE: Final = "vllm.grpc.engine.VllmEngine"
GENERATE: Final = f"{SERVICE}/Generate"
EMBED: Final = f"{SERVICE}/Embed"
CLAIMS: tuple[str, ...] = (GENERATE, EMBED)

_ROUTES: SuffixTable[str] = SuffixTable([(GENERATE, GENERATE), (EMBED, EMBED)])


def _generate(body: bytes) -> RequestBody:
    where = "invalid vLLM GenerateRequest: "
    request = decode(vllm.GenerateRequest, request_message(body, where), where)
    source = request.WhichOneof("input")
    prompt: Any
    ids: tuple[int, ...] | None = None
    if source == "tokenized":
        ids = tuple(request.tokenized.input_ids)
        if not ids:
            raise bad_request(f"{where}tokenized.input_ids is empty")
        prompt = list(ids)
    elif source == "text":
        prompt = request.text
        if not prompt:
            raise bad_request(f"{where}text is empty")
    else:
        raise bad_request(f"{where}must have a tokenized or text input")
    sampling = request.sampling_params
    return RequestBody(
        kind="completions",
        payload={"prompt": prompt},
        raw=body,
        stream=request.stream,
        max_output_tokens=sampling.max_tokens if sampling.HasField("max_tokens") else None,
        token_ids=ids,
    )


def _embed(body: bytes) -> RequestBody:
    where = "invalid vLLM EmbedRequest: "
    request = decode(vllm.EmbedRequest, request_message(body, where), where)
    if not request.HasField("tokenized"):
        raise bad_request(f"{where}must have a tokenized input")
    ids = tuple(request.tokenized.input_ids)
    if not ids:
        raise bad_request(f"{where}tokenized.input_ids is empty")
    return RequestBody(kind="embeddings", payload={"input": list(ids)}, raw=body, token_ids=ids)


def _counts(prompt: int, completion: int, cached: int) -> Usage | None:
    if not prompt and not completion:
        return None
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        total_tokens=prompt + completion,
    )


def message_usage(payload: bytes) -> Usage | None:
    """The token counts one response message reports (see the module docstring)."""
    generated = try_decode(vllm.GenerateResponse, payload)
    if generated is not None and not len(UnknownFieldSet(generated)):
        kind = generated.WhichOneof("response")
        if kind == "chunk":
            c = generated.chunk
            return _counts(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
        if kind == "complete":
            done = generated.complete
            return _counts(done.prompt_tokens, done.completion_tokens, done.cached_tokens)
    embedded = try_decode(vllm.EmbedResponse, payload)
    if embedded is not None and embedded.prompt_tokens:
        return _counts(embedded.prompt_tokens, 0, 0)
    return None


class VllmResponseState:
    """Usage of one answer, message by message as its chunks arrive."""

    __slots__ = ("_frames",)

    def __init__(self) -> None:
        self._frames = FrameReader()

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse:
        found: Usage | None = None
        for payload in self._frames.feed(chunk):
            usage = message_usage(payload)
            if usage is not None:
                if found is None:
                    found = usage
                else:
                    found.merge(usage)
        return ParsedResponse(usage=found)


class VllmGrpcParser(ParserBase):
    """Parser for vLLM's gRPC ``Generate`` and ``Embed``; see the module docstring."""

    TYPE: ClassVar[str] = "vllmgrpc-parser"
    supports_model_rewrite: ClassVar[bool] = False

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C,)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        route = _ROUTES.lookup(strip_query(path))
        if route == GENERATE:
            return ParseResult(model="", body=_generate(body))
        if route == EMBED:
            return ParseResult(model="", body=_embed(body))
        return ParseResult(
            model="",
            body=RequestBody(kind="raw", payload=None, raw=body),
            skip_response_processing=True,
        )

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        # A protobuf request names no model: the body is forwarded as it came.
        return body.raw

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return VllmResponseState().feed(chunk, True)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> VllmResponseState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return VllmResponseState()
