"""``anthropic-parser``: the Anthropic Messages API.

Claimed path suffixes::

    messages                -> kind "anthropic-messages"      needs >= 1 message
    messages/count_tokens   -> kind "anthropic-count-tokens"  raw bytes, response phase skipped

``/messages`` bodies are decoded once: ``model`` (string, else ""), ``stream`` (JSON ``true``),
``max_tokens`` (non-negative whole number) and ``cache_salt`` are extracted; ``messages`` must be a
non-empty array of objects whose ``content`` is a string or an array of content blocks; ``system``
follows the same content rule and ``tools`` must be an array of objects. ``count_tokens`` requests
only return a count, so they are forwarded untouched (payload ``None``, model "") with
``skip_response_processing``.

``rewrite_model`` re-serialises the payload with ``model`` replaced (compact, sorted keys).
Responses: ``usage.input_tokens``/``output_tokens``/``cache_read_input_tokens`` for JSON bodies;
SSE ``message_start.message.usage`` + ``message_delta.usage.output_tokens``. Example stream::

    event: message_start
    data: {"type":"message_start","message":{"usage":{"input_tokens":25}}}

    event: message_delta
    data: {"type":"message_delta","delta":{},"usage":{"output_tokens":15}}

Parameters: none. Example::

    requestHandler:
      parsers:
      - pluginRef: anthropic-parser
    plugins:
    - type: anthropic-parser
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, ParsedResponse, ParseResult, RequestBody
from epp.plugin.paths import SuffixTable, strip_query
from epp.plugins.parsers.common import (
    ARRAY,
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
)
from epp.plugins.parsers.openai import rewrite_model
from epp.plugins.parsers.usage import AnthropicDialect, ResponseUsageState, parse_whole

MESSAGES = "messages"
COUNT_TOKENS = "messages/count_tokens"
CLAIMS: tuple[str, ...] = (MESSAGES, COUNT_TOKENS)

_ROUTES: SuffixTable[str] = SuffixTable([(MESSAGES, MESSAGES), (COUNT_TOKENS, COUNT_TOKENS)])

_WHERE = "invalid messages request: "
_REQUEST_FIELDS: Mapping[str, FieldCheck] = {"tools": ARRAY, "cache_salt": STRING}
_MESSAGE_FIELDS: Mapping[str, FieldCheck] = {"role": STRING}
_TOOL_FIELDS: Mapping[str, FieldCheck] = {"name": STRING, "description": STRING}
_BLOCK_FIELDS: Mapping[str, FieldCheck] = {
    "type": STRING,
    "text": STRING,
    "source": OBJECT,
    "id": STRING,
    "name": STRING,
    "tool_use_id": STRING,
    "thinking": STRING,
}
_MAX_NESTING = 8  # tool_result blocks nest content; deeper bodies are not legitimate


def _check_content(content: Any, where: str, depth: int = 0) -> None:
    """Content is null, a string, or an array of blocks (tool_result blocks nest content)."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_request(
            f"{_WHERE}{where} must be a string or an array of content blocks, "
            f"got {json_type(content)}"
        )
    check_objects(content, _BLOCK_FIELDS, f"{_WHERE}{where}")
    if depth >= _MAX_NESTING:
        raise bad_request(f"{_WHERE}{where} nests content too deeply")
    for i, block in enumerate(content):
        if "content" in block:
            _check_content(block["content"], f"{where}[{i}].content", depth + 1)


def _validate(payload: dict[str, Any]) -> None:
    check_fields(payload, _REQUEST_FIELDS, _WHERE)
    messages = payload.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise bad_request(f"{_WHERE}messages must be an array, got {json_type(messages)}")
    if not messages:
        raise bad_request(f"{_WHERE}must have at least one message")
    check_objects(messages, _MESSAGE_FIELDS, f"{_WHERE}messages")
    for i, message in enumerate(messages):
        _check_content(message.get("content"), f"messages[{i}].content")
    _check_content(payload.get("system"), "system")
    tools = payload.get("tools")
    if tools:
        check_objects(tools, _TOOL_FIELDS, f"{_WHERE}tools")


class AnthropicParser(ParserBase):
    """Parser for the Anthropic Messages API; see the module docstring."""

    TYPE: ClassVar[str] = "anthropic-parser"
    supports_model_rewrite: ClassVar[bool] = True

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        route = _ROUTES.lookup(strip_query(path))
        if route == COUNT_TOKENS:
            return ParseResult(
                model="",
                body=RequestBody(kind="anthropic-count-tokens", payload=None, raw=body),
                skip_response_processing=True,
            )
        if route != MESSAGES:
            raise bad_request(f"unsupported API endpoint: {path}")
        payload = decode_object(body)
        _validate(payload)
        model = payload.get("model")
        return ParseResult(
            model=model if isinstance(model, str) else "",
            body=RequestBody(
                kind="anthropic-messages",
                payload=payload,
                raw=body,
                stream=payload.get("stream") is True,
                max_output_tokens=max_output_tokens(payload, "max_tokens"),
                cache_salt=cache_salt(payload),
            ),
        )

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        return rewrite_model(body, target_model)

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return parse_whole(AnthropicDialect, chunk, headers)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseUsageState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return ResponseUsageState(AnthropicDialect, headers)
