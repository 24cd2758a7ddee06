"""``vllmhttp-parser``: vLLM's native tokenised generate endpoint.

Claimed path suffix::

    inference/v1/generate   -> kind "vllm-generate"

Request: ``token_ids`` is required (a non-empty array of unsigned 32-bit integers, exposed as
``RequestBody.token_ids``); optional ``features.mm_hashes`` (modality -> array of strings) and
``features.mm_placeholders`` (modality -> array of ``{offset, length}`` integers) are validated and
stay in the payload; ``cache_salt``, ``model`` (string, else ""), ``stream`` (JSON ``true``) and
``sampling_params.max_tokens`` (non-negative whole number) are extracted. Responses share the
OpenAI usage shape and are parsed with the OpenAI dialect.

Example request::

    POST /inference/v1/generate
    {"model": "m", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 16}, "stream": false}

Parameters: none. Example::

    requestHandler:
      parsers:
      - pluginRef: vllmhttp-parser
    plugins:
    - type: vllmhttp-parser
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, ParsedResponse, ParseResult, RequestBody
from epp.plugin.paths import SuffixTable, strip_query
from epp.plugins.parsers.common import (
    INTEGER,
    OBJECT,
    STRING,
    FieldCheck,
    ParserBase,
    bad_request,
    cache_salt,
    check_fields,
    check_objects,
    decode_object,
    json_type,
    max_output_tokens,
    token_ids,
)
from epp.plugins.parsers.openai import rewrite_model
from epp.plugins.parsers.usage import OpenAIDialect, ResponseUsageState, parse_whole

GENERATE = "inference/v1/generate"
CLAIMS: tuple[str, ...] = (GENERATE,)

_ROUTES: SuffixTable[str] = SuffixTable([(GENERATE, GENERATE)])
_WHERE = "invalid generate request: "
_REQUEST_FIELDS: Mapping[str, FieldCheck] = {
    "cache_salt": STRING,
    "features": OBJECT,
    "sampling_params": OBJECT,
}
_PLACEHOLDER_FIELDS: Mapping[str, FieldCheck] = {"offset": INTEGER, "length": INTEGER}


def _modality_map(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{_WHERE}{where} must be an object, got {json_type(value)}")
    for modality, items in value.items():
        if items is not None and not isinstance(items, list):
            raise bad_request(
                f"{_WHERE}{where}.{modality} must be an array, got {json_type(items)}"
            )
    return value


def _check_features(features: dict[str, Any]) -> None:
    for modality, hashes in _modality_map(features.get("mm_hashes"), "features.mm_hashes").items():
        for i, h in enumerate(hashes or ()):
            if not isinstance(h, str):
                raise bad_request(
                    f"{_WHERE}features.mm_hashes.{modality}[{i}] must be a string, "
                    f"got {json_type(h)}"
                )
    where = "features.mm_placeholders"
    for modality, ranges in _modality_map(features.get("mm_placeholders"), where).items():
        check_objects(ranges or (), _PLACEHOLDER_FIELDS, f"{_WHERE}{where}.{modality}")


class VllmHttpParser(ParserBase):
    """Parser for vLLM's ``/inference/v1/generate``; see the module docstring."""

    TYPE: ClassVar[str] = "vllmhttp-parser"
    supports_model_rewrite: ClassVar[bool] = True

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        if _ROUTES.lookup(strip_query(path)) is None:
            raise bad_request(f"unsupported path: {path}")
        payload = decode_object(body)
        check_fields(payload, _REQUEST_FIELDS, _WHERE)
        ids = payload.get("token_ids")
        if ids is not None and not isinstance(ids, list):
            raise bad_request(f"{_WHERE}token_ids must be an array, got {json_type(ids)}")
        if not ids:
            raise bad_request(f"{_WHERE}must have non-empty token_ids field")
        tokens = token_ids(ids, f"{_WHERE}token_ids")
        features = payload.get("features")
        if features is not None:
            _check_features(features)
        sampling = payload.get("sampling_params")
        model = payload.get("model")
        return ParseResult(
            model=model if isinstance(model, str) else "",
            body=RequestBody(
                kind="vllm-generate",
                payload=payload,
                raw=body,
                stream=payload.get("stream") is True,
                max_output_tokens=max_output_tokens(sampling, "max_tokens") if sampling else None,
                cache_salt=cache_salt(payload),
                token_ids=tokens,
            ),
        )

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        return rewrite_model(body, target_model)

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return parse_whole(OpenAIDialect, chunk, headers)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseUsageState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return ResponseUsageState(OpenAIDialect, headers)
