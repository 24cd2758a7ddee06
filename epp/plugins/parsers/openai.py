"""``openai-parser``: OpenAI-compatible HTTP APIs.

Claimed path suffixes (matched on whole trailing segments, e.g. ``/v1/chat/completions``)::

    chat/completions          -> kind "chat"         needs >= 1 message
    chat/completions/render   -> kind "chat"
    completions               -> kind "completions"  needs a non-empty prompt
    completions/render        -> kind "completions"
    embeddings                -> kind "embeddings"   needs a non-empty input
    responses                 -> kind "responses"    needs input (any non-null value)
    conversations             -> kind "conversations" needs a non-empty items array
    images/generations        -> kind "images"       needs a non-empty prompt string

Any other path (the parser may be called directly) is treated as completions.

Extracted: ``model`` (string, else ""), ``stream`` (true only for JSON ``true``), ``cache_salt``,
max output tokens (chat: ``max_completion_tokens`` then ``max_tokens``; completions:
``max_tokens``; responses: ``max_output_tokens``; non-negative whole numbers only) and, for a
prompt/input given as token ids, the ids. The body is decoded once; the decoded object is the
payload and the original bytes are kept as ``raw`` (no copy). Validation failures are 400s.

``rewrite_model`` re-serialises the payload with ``model`` replaced, keys sorted recursively and
no whitespace (what Go's ``json.Marshal`` of a map produces). Responses: see
``epp.plugins.parsers.usage`` (OpenAI dialect).

Parameters: none. Example::

    requestHandler:
      parsers:
      - pluginRef: openai-parser
    plugins:
    - type: openai-parser
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import orjson

from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, ParsedResponse, ParseResult, RequestBody
from epp.plugin.paths import SuffixTable, strip_query
from epp.plugins.parsers.common import (
    ARRAY,
    BOOLEAN,
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
    text_or_tokens,
)
from epp.plugins.parsers.usage import (
    OpenAIDialect,
    ResponseUsageState,
    parse_whole,
)

CLAIMS: tuple[str, ...] = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "conversations",
    "chat/completions/render",
    "completions/render",
    "images/generations",
)

_KIND_BY_SUFFIX: SuffixTable[str] = SuffixTable(
    [
        ("chat/completions", "chat"),
        ("chat/completions/render", "chat"),
        ("completions", "completions"),
        ("completions/render", "completions"),
        ("embeddings", "embeddings"),
        ("responses", "responses"),
        ("conversations", "conversations"),
        ("images/generations", "images"),
    ]
)

_CHAT_FIELDS: Mapping[str, FieldCheck] = {
    "tools": ARRAY,
    "documents": ARRAY,
    "chat_template": STRING,
    "return_assistant_tokens_mask": BOOLEAN,
    "continue_final_message": BOOLEAN,
    "add_generation_prompt": BOOLEAN,
    "chat_template_kwargs": OBJECT,
    "cache_salt": STRING,
}
_MESSAGE_FIELDS: Mapping[str, FieldCheck] = {"role": STRING, "tool_calls": ARRAY}
_CONTENT_BLOCK_FIELDS: Mapping[str, FieldCheck] = {
    "type": STRING,
    "text": STRING,
    "image_url": OBJECT,
    "input_audio": OBJECT,
    "video_url": OBJECT,
}
_SALT_ONLY: Mapping[str, FieldCheck] = {"cache_salt": STRING}
_CONVERSATION_FIELDS: Mapping[str, FieldCheck] = {"metadata": OBJECT, "cache_salt": STRING}
_CONVERSATION_ITEM_FIELDS: Mapping[str, FieldCheck] = {"type": STRING, "role": STRING}
_IMAGES_FIELDS: Mapping[str, FieldCheck] = {
    "size": STRING,
    "n": INTEGER,
    "num_inference_steps": INTEGER,
}

# What a per-API validator extracts besides the common fields: (max output tokens, token ids).
_Extracted = tuple[int | None, tuple[int, ...] | None]


def _chat(payload: dict[str, Any]) -> _Extracted:
    where = "invalid chat completions request: "
    check_fields(payload, _CHAT_FIELDS, where)
    messages = payload.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise bad_request(f"{where}messages must be an array, got {json_type(messages)}")
    if not messages:
        raise bad_request(f"{where}must have at least one message")
    check_objects(messages, _MESSAGE_FIELDS, f"{where}messages")
    for i, message in enumerate(messages):
        content = message.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise bad_request(
                f"{where}messages[{i}].content must be a string or an array of content blocks, "
                f"got {json_type(content)}"
            )
        check_objects(content, _CONTENT_BLOCK_FIELDS, f"{where}messages[{i}].content")
    return max_output_tokens(payload, "max_completion_tokens", "max_tokens"), None


def _completions(payload: dict[str, Any]) -> _Extracted:
    where = "invalid completions request: "
    check_fields(payload, _SALT_ONLY, where)
    non_empty, ids = text_or_tokens(payload.get("prompt"), f"{where}prompt")
    if not non_empty:
        raise bad_request(f"{where}must have prompt field")
    return max_output_tokens(payload, "max_tokens"), ids


def _embeddings(payload: dict[str, Any]) -> _Extracted:
    where = "invalid embeddings request: "
    check_fields(payload, _SALT_ONLY, where)
    non_empty, ids = text_or_tokens(payload.get("input"), f"{where}input")
    if not non_empty:
        raise bad_request(f"{where}must have input field")
    return None, ids


def _responses(payload: dict[str, Any]) -> _Extracted:
    where = "invalid responses request: "
    check_fields(payload, _SALT_ONLY, where)
    if payload.get("input") is None:
        raise bad_request(f"{where}must have input field")
    return max_output_tokens(payload, "max_output_tokens"), None


def _conversations(payload: dict[str, Any]) -> _Extracted:
    where = "invalid conversations request: "
    check_fields(payload, _CONVERSATION_FIELDS, where)
    items = payload.get("items")
    if items is not None and not isinstance(items, list):
        raise bad_request(f"{where}items must be an array, got {json_type(items)}")
    if not items:
        raise bad_request(f"{where}must have items field")
    check_objects(items, _CONVERSATION_ITEM_FIELDS, f"{where}items")
    return None, None


def _images(payload: dict[str, Any]) -> _Extracted:
    where = "invalid images generations request: "
    check_fields(payload, _IMAGES_FIELDS, where)
    prompt = payload.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise bad_request(f"{where}prompt must be a string, got {json_type(prompt)}")
    if not prompt:
        raise bad_request(f"{where}must have prompt field")
    return None, None


_EXTRACTORS: Mapping[str, Callable[[dict[str, Any]], _Extracted]] = {
    "chat": _chat,
    "completions": _completions,
    "embeddings": _embeddings,
    "responses": _responses,
    "conversations": _conversations,
    "images": _images,
}


def api_kind(path: str) -> str:
    """The API a path addresses; unknown paths are completions, as upstream."""
    return _KIND_BY_SUFFIX.lookup(strip_query(path)) or "completions"


def parse_openai_body(kind: str, body: bytes) -> ParseResult:
    """Decode and validate an OpenAI request body of the given kind (shared with other parsers
    that speak the OpenAI schema)."""
    payload = decode_object(body)
    max_tokens, ids = _EXTRACTORS[kind](payload)
    model = payload.get("model")
    return ParseResult(
        model=model if isinstance(model, str) else "",
        body=RequestBody(
            kind=kind,
            payload=payload,
            raw=body,
            stream=payload.get("stream") is True,
            max_output_tokens=max_tokens,
            cache_salt=cache_salt(payload),
            token_ids=ids,
        ),
    )


def rewrite_model(body: RequestBody, target_model: str) -> bytes:
    """The payload with ``model`` set to ``target_model``: compact JSON, keys sorted recursively.

    The decoded payload is left untouched (a shallow copy carries the new model); a body without
    a decoded payload is returned as it was received.
    """
    if body.payload is None:
        return body.raw
    return orjson.dumps({**body.payload, "model": target_model}, option=orjson.OPT_SORT_KEYS)


class OpenAIParser(ParserBase):
    """Parser for the OpenAI-compatible API family; see the module docstring."""

    TYPE: ClassVar[str] = "openai-parser"
    supports_model_rewrite: ClassVar[bool] = True

    def claims(self) -> tuple[str, ...]:
        return CLAIMS

    def app_protocols(self) -> tuple[str, ...]:
        return (APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP)

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult:
        return parse_openai_body(api_kind(path), body)

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes:
        return rewrite_model(body, target_model)

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse:
        return parse_whole(OpenAIDialect, chunk, headers)

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseUsageState:
        """Per-response incremental usage parser (feed it every streamed chunk)."""
        return ResponseUsageState(OpenAIDialect, headers)
