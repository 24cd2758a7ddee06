from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.plugin import ErrorCode, InferenceError, Parser, RequestBody
from epp.plugins.parsers.openai import OpenAIParser, api_kind

PARSER = OpenAIParser(name=OpenAIParser.TYPE, params=OpenAIParser.Params(), handle=None)
HEADERS: dict[str, str] = {}


def parse(path: str, payload: Any) -> Any:
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return PARSER.parse_request(path, body, HEADERS)


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "openai-parser"
    assert PARSER.supports_model_rewrite is True
    assert PARSER.claims() == (
        "chat/completions",
        "completions",
        "embeddings",
        "responses",
        "conversations",
        "chat/completions/render",
        "completions/render",
        "images/generations",
    )


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        pytest.param("/v1/chat/completions", "chat", id="chat"),
        pytest.param("/v1/chat/completions/render", "chat", id="chat-render"),
        pytest.param("/v1/completions", "completions", id="completions"),
        pytest.param("/v1/completions/render", "completions", id="completions-render"),
        pytest.param("/v1/embeddings", "embeddings", id="embeddings"),
        pytest.param("/v1/responses", "responses", id="responses"),
        pytest.param("/v1/conversations", "conversations", id="conversations"),
        pytest.param("/v1/images/generations", "images", id="images"),
        pytest.param("/v1/chat/completions/", "chat", id="trailing-slash"),
        pytest.param("/v1/chat/completions?x=1", "chat", id="query"),
        pytest.param("/v1/projects/p/endpoints/e/chat/completions", "chat", id="provider-prefix"),
        pytest.param("/v1/models", "completions", id="unknown-defaults-to-completions"),
        pytest.param("", "completions", id="empty"),
    ],
)
def test_api_kind_matches_path_suffix_when_path_given(path: str, kind: str) -> None:
    assert api_kind(path) == kind


@pytest.mark.parametrize(
    ("path", "payload", "expected"),
    [
        pytest.param(
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 7,
                "max_tokens": 9,
                "stream": True,
                "cache_salt": "s",
            },
            ("chat", "m", True, 7, "s", None),
            id="chat-prefers-max-completion-tokens",
        ),
        pytest.param(
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "hi"},
                            {"type": "image_url", "image_url": {"url": "http://x"}},
                        ],
                    },
                    {"role": "assistant", "content": None, "tool_calls": []},
                ],
                "max_completion_tokens": -1,
                "max_tokens": 9,
            },
            ("chat", "m", False, 9, "", None),
            id="chat-blocks-and-invalid-cap-falls-back",
        ),
        pytest.param(
            "/v1/completions",
            {"model": "m", "prompt": "hello", "max_tokens": 1e3, "stream": "yes"},
            ("completions", "m", False, 1000, "", None),
            id="completions-float-cap-and-non-bool-stream",
        ),
        pytest.param(
            "/v1/completions",
            {"model": "m", "prompt": ["a", "b"], "max_tokens": 2.5},
            ("completions", "m", False, None, "", None),
            id="completions-string-list-fractional-cap",
        ),
        pytest.param(
            "/v1/completions",
            {"model": "m", "prompt": [1, 2, 4294967295]},
            ("completions", "m", False, None, "", (1, 2, 4294967295)),
            id="completions-token-ids",
        ),
        pytest.param(
            "/v1/embeddings",
            {"model": "e", "input": [5, 6.0], "max_tokens": 3},
            ("embeddings", "e", False, None, "", (5, 6)),
            id="embeddings-token-ids-no-cap",
        ),
        pytest.param(
            "/v1/responses",
            {"model": "r", "input": "", "max_output_tokens": 0, "instructions": "be brief"},
            ("responses", "r", False, 0, "", None),
            id="responses-empty-string-input-is-present",
        ),
        pytest.param(
            "/v1/conversations",
            {"items": [{"type": "message", "role": "user", "content": "x"}]},
            ("conversations", "", False, None, "", None),
            id="conversations-without-model",
        ),
        pytest.param(
            "/v1/images/generations",
            {"model": "img", "prompt": "a cat", "n": 2, "size": "64x64"},
            ("images", "img", False, None, "", None),
            id="images",
        ),
        pytest.param(
            "/v1/completions",
            {"model": 42, "prompt": "x"},
            ("completions", "", False, None, "", None),
            id="non-string-model-is-empty",
        ),
    ],
)
def test_parse_request_extracts_fields_when_body_valid(
    path: str, payload: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    result = parse(path, payload)
    body = result.body
    got = (body.kind, result.model, body.stream, body.max_output_tokens, body.cache_salt)
    assert (*got, body.token_ids) == expected
    assert body.payload == payload
    assert result.skip_response_processing is False


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(
            "/v1/completions",
            b'{"prompt": "x"',
            "error unmarshaling request bodyMap: unexpected end of data",
            id="truncated-json",
        ),
        pytest.param(
            "/v1/completions",
            b"",
            "error unmarshaling request bodyMap: Input is a zero-length",
            id="empty-body",
        ),
        pytest.param(
            "/v1/completions",
            b"[1, 2]",
            "error unmarshaling request bodyMap: request body must be a JSON object, got array",
            id="array-body",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"model": "m"}',
            "invalid chat completions request: must have at least one message",
            id="chat-missing-messages",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"model": "m", "messages": []}',
            "invalid chat completions request: must have at least one message",
            id="chat-empty-messages",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": "hi"}',
            "invalid chat completions request: messages must be an array, got string",
            id="chat-messages-not-array",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": [1]}',
            "invalid chat completions request: messages[0] must be an object, got number",
            id="chat-message-not-object",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": 5}]}',
            "invalid chat completions request: messages[0].content must be a string or an array",
            id="chat-content-number",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": [{"content": [{"type": "text", "text": 1}]}]}',
            "invalid chat completions request: messages[0].content[0].text must be a string",
            id="chat-block-text-not-string",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": [{"content": "x"}], "cache_salt": 3}',
            "invalid chat completions request: cache_salt must be a string, got number",
            id="chat-cache-salt-not-string",
        ),
        pytest.param(
            "/v1/completions",
            b'{"model": "m"}',
            "invalid completions request: must have prompt field",
            id="completions-missing-prompt",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": ""}',
            "invalid completions request: must have prompt field",
            id="completions-empty-prompt",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": []}',
            "invalid completions request: must have prompt field",
            id="completions-empty-list",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": ["a", 1]}',
            "invalid completions request: prompt: mixed types in array",
            id="completions-mixed-list",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": [1, -1]}',
            "invalid completions request: prompt must hold unsigned 32-bit integers",
            id="completions-negative-token",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": [1, 2.5]}',
            "invalid completions request: prompt[1] must be an unsigned 32-bit integer",
            id="completions-fractional-token",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": [[1, 2]]}',
            "invalid completions request: prompt: unsupported array element type array",
            id="completions-nested-token-lists",
        ),
        pytest.param(
            "/v1/completions",
            b'{"prompt": {"a": 1}}',
            "invalid completions request: prompt must be a string or an array, got object",
            id="completions-prompt-object",
        ),
        pytest.param(
            "/v1/embeddings",
            b'{"model": "m"}',
            "invalid embeddings request: must have input field",
            id="embeddings-missing-input",
        ),
        pytest.param(
            "/v1/responses",
            b'{"model": "m", "input": null}',
            "invalid responses request: must have input field",
            id="responses-null-input",
        ),
        pytest.param(
            "/v1/conversations",
            b'{"items": []}',
            "invalid conversations request: must have items field",
            id="conversations-empty-items",
        ),
        pytest.param(
            "/v1/conversations",
            b'{"items": [{"role": 1}]}',
            "invalid conversations request: items[0].role must be a string",
            id="conversations-bad-item",
        ),
        pytest.param(
            "/v1/images/generations",
            b'{"model": "m"}',
            "invalid images generations request: must have prompt field",
            id="images-missing-prompt",
        ),
        pytest.param(
            "/v1/images/generations",
            b'{"prompt": "x", "n": 1.5}',
            "invalid images generations request: n must be an integer, got number",
            id="images-fractional-n",
        ),
    ],
)
def test_parse_request_raises_bad_request_when_body_invalid(
    path: str, body: bytes, message: str
) -> None:
    with pytest.raises(InferenceError) as info:
        PARSER.parse_request(path, body, HEADERS)
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message.startswith(message)


def test_parse_request_returns_empty_model_when_model_missing() -> None:
    result = parse("/v1/completions", {"prompt": "hello world"})
    assert result.model == ""
    assert result.body.kind == "completions"


def test_parse_request_keeps_raw_bytes_without_copy_when_body_is_one_mebibyte() -> None:
    text = "x" * (1 << 20)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": text}]})
    assert len(body) > 1 << 20
    result = PARSER.parse_request("/v1/chat/completions", body, HEADERS)
    assert result.body.raw is body
    assert result.body.payload is not None
    assert result.body.payload["messages"][0]["content"] == text


@pytest.mark.parametrize(
    ("payload", "target", "expected"),
    [
        pytest.param(
            {"prompt": "p", "model": "a", "max_tokens": 5},
            "b",
            b'{"max_tokens":5,"model":"b","prompt":"p"}',
            id="top-level-sorted-compact",
        ),
        pytest.param(
            {"z": {"y": 1, "b": [{"d": 1, "c": 2}]}, "messages": [], "model": "a"},
            "t",
            b'{"messages":[],"model":"t","z":{"b":[{"c":2,"d":1}],"y":1}}',
            id="nested-keys-sorted",
        ),
        pytest.param(
            {"prompt": "héllo ✓"},
            "m",
            '{"model":"m","prompt":"héllo ✓"}'.encode(),
            id="adds-missing-model-and-keeps-utf8",
        ),
    ],
)
def test_rewrite_model_produces_sorted_compact_json_when_target_given(
    payload: dict[str, Any], target: str, expected: bytes
) -> None:
    body = RequestBody(kind="completions", payload=payload, raw=orjson.dumps(payload))
    before = dict(payload)
    assert PARSER.rewrite_model(body, target) == expected
    assert payload == before


def test_rewrite_model_returns_raw_when_payload_missing() -> None:
    body = RequestBody(kind="raw", payload=None, raw=b"not json")
    assert PARSER.rewrite_model(body, "m") is body.raw


def test_parse_response_extracts_usage_when_body_is_json() -> None:
    chunk = b'{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}'
    parsed = PARSER.parse_response(chunk, {}, streaming=False, end_of_stream=True)
    assert parsed.usage is not None
    assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens) == (3, 4)
    assert parsed.usage.total_tokens == 7


def test_new_response_state_reassembles_usage_when_event_split_across_chunks() -> None:
    state = PARSER.new_response_state({"content-type": "text/event-stream"})
    first = state.feed(b'data: {"choices":[]}\n\ndata: {"usage":{"prompt_to', False)
    second = state.feed(b'kens":7,"completion_tokens":2}}\n\ndata: [DONE]\n\n', True)
    assert (first.usage, first.streamed_events) == (None, 1)
    assert second.usage is not None
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == (7, 2)
    assert second.streamed_events == 1
