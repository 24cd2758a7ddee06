"""``sglanghttp-parser``: SGLang's native, pre-tokenised ``/generate`` endpoint.

Claimed path suffix::

    generate   -> kind "sglang-generate"   (the path must be exactly ``/generate``)

Any other path that reaches the parser (``/v1/generate``: the router matches suffixes) is a 400
``unsupported path``.

Request: ``input_ids`` is required, a non-empty array of unsigned 32-bit integers (exposed as
``RequestBody.token_ids``; a batch, an array of arrays, is refused); ``extra_key`` must be a string
when present and becomes the cache salt (SGLang isolates prefix-cache entries by it, as vLLM by
``cache_salt``); ``sampling_params`` must be an object, whose ``max_new_tokens`` (non-negative whole
number) is the output cap; ``stream`` is JSON ``true``. ``model`` is not part of the API: the model
is "" and the body is forwarded byte for byte (no model rewrite). The decoded object is the
payload.

Responses: ``meta_info.prompt_tokens``, ``completion_tokens`` and ``cached_tokens`` of a JSON body;
in an SSE stream (``stream: true``), those of the first ``data:`` event whose
``meta_info.finish_reason`` is not null (see ``epp.plugins.parsers.usage``, SGLang dialect).

Example request::

    POST /generate
    {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 16}, "extra_key": "tenant-a"}

Parameters: none. Claims both the ``http`` and ``kubernetes.io/h2c`` app protocols. Example::

    requestHandler:
      parsers:
      - pluginRef: sglanghttp-parser
    plugins:
    - type: sglanghttp-parser
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, ParsedResponse, ParseResult, RequestBody
from epp.plugin.paths import normalize_suffix, strip_query
from epp.plugins.parsers.common import (
    OBJECT,
    STRING,
    FieldCheck,
    ParserBase,
    bad_request,
    check_fields,
    decode_object,
    json_type,
    max_output_tokens,
    token_ids,
)
from epp.plugins.parsers.usage import ResponseUsageState, SGLangDialect, parse_whole

GENERATE = "generate"
CLAIMS: tuple[str, ...] = (GENERATE,)

_WHERE = "invalid generate request: "
_REQUEST_FIELDS: Mapping[str, FieldCheck] = {"extra_key": STRING, "sampling_params": OBJECT}


class SGLangHttpParser(ParserBase):
    """Parser for SGLang's ``/generate``; see the module docstring."""

    TYPE: ClassVar[str] = "sglanghttp-parser"
    supports_model_rewrite: ClassVar[bool] = False

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        if normalize_suffix(strip_query(path)) != GENERATE:
            raise bad_request(f"unsupported path: {path}")
        payload = decode_object(body)
        check_fields(payload, _REQUEST_FIELDS, _WHERE)
        ids = payload.get("input_ids")
        if ids is not None and not isinstance(ids, list):
            raise bad_request(f"{_WHERE}input_ids must be an array, got {json_type(ids)}")
        if not ids:
            raise bad_request(f"{_WHERE}must have non-empty input_ids field")
        if isinstance(ids[0], list):
            raise bad_request(f"{_WHERE}batched input_ids (an array of arrays) are not supported")
        tokens = token_ids(ids, f"{_WHERE}input_ids")
        sampling = payload.get("sampling_params")
        salt = payload.get("extra_key")
        return ParseResult(
            model="",
            body=RequestBody(
                kind="sglang-generate",
                payload=payload,
                raw=body,
                stream=payload.get("stream") is True,
                max_output_tokens=max_output_tokens(sampling, "max_new_tokens")
                if sampling
                else None,
                cache_salt=salt if isinstance(salt, str) else "",
                token_ids=tokens,
            ),
        )

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        # /generate names no model: the body is forwarded as it came.
        return body.raw

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return parse_whole(SGLangDialect, chunk, headers)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseUsageState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return ResponseUsageState(SGLangDialect, headers)
