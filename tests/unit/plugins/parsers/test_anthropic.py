from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.plugin import ErrorCode, InferenceError, Parser, Usage
from epp.plugins.parsers.anthropic import AnthropicParser

PARSER = AnthropicParser(name=AnthropicParser.TYPE, params=AnthropicParser.Params(), handle=None)
SSE = {"content-type": "text/event-stream"}


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "anthropic-parser"
    assert PARSER.supports_model_rewrite is True
    assert PARSER.claims() == ("messages", "messages/count_tokens")


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(
            {
                "model": "claude",
                "max_tokens": 64,
                "stream": True,
                "system": "be brief",
                "messages": [{"role": "user", "content": "hi"}],
                "cache_salt": "s",
            },
            ("claude", True, 64, "s"),
            id="string-content",
        ),
        pytest.param(
            {
                "model": "claude",
                "system": [{"type": "text", "text": "sys"}],
                "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}]},
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "x",
                                "content": [{"type": "text", "text": "r"}],
                            }
                        ],
                    },
                ],
            },
            ("claude", False, None, ""),
            id="blocks-tools-and-nested-tool-result",
        ),
        pytest.param(
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
            ("", False, None, ""),
            id="missing-model-and-negative-cap",
        ),
    ],
)
def test_parse_request_extracts_fields_when_messages_valid(
    payload: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    body = orjson.dumps(payload)
    result = PARSER.parse_request("/v1/messages", body, {})
    got = (result.model, result.body.stream, result.body.max_output_tokens, result.body.cache_salt)
    assert got == expected
    assert result.body.kind == "anthropic-messages"
    assert result.body.payload == payload
    assert result.body.raw is body
    assert result.skip_response_processing is False


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"model":"claude","messages":[]}', id="json"),
        pytest.param(b"not json at all", id="not-json"),
    ],
)
def test_parse_request_forwards_raw_and_skips_response_when_count_tokens(body: bytes) -> None:
    result = PARSER.parse_request("/v1/messages/count_tokens?beta=true", body, {})
    assert result.skip_response_processing is True
    assert result.model == ""
    assert result.body.kind == "anthropic-count-tokens"
    assert result.body.payload is None
    assert result.body.raw is body


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(
            "/v1/messages",
            b"{",
            "error unmarshaling request bodyMap: unexpected end of data",
            id="invalid-json",
        ),
        pytest.param(
            "/v1/messages",
            b'"text"',
            "error unmarshaling request bodyMap: request body must be a JSON object, got string",
            id="string-body",
        ),
        pytest.param(
            "/v1/messages",
            b'{"model": "m"}',
            "invalid messages request: must have at least one message",
            id="missing-messages",
        ),
        pytest.param(
            "/v1/messages",
            b'{"messages": {}}',
            "invalid messages request: messages must be an array, got object",
            id="messages-object",
        ),
        pytest.param(
            "/v1/messages",
            b'{"messages": [{"role": "user", "content": 1}]}',
            "invalid messages request: messages[0].content must be a string or an array",
            id="content-number",
        ),
        pytest.param(
            "/v1/messages",
            b'{"messages": [{"content": "x"}], "system": 5}',
            "invalid messages request: system must be a string or an array",
            id="system-number",
        ),
        pytest.param(
            "/v1/messages",
            b'{"messages": [{"content": "x"}], "tools": [3]}',
            "invalid messages request: tools[0] must be an object, got number",
            id="tool-not-object",
        ),
        pytest.param(
            "/v1/messages",
            b'{"messages": [{"content": [{"type": "tool_result", "content": 7}]}]}',
            "invalid messages request: messages[0].content[0].content must be a string",
            id="nested-content-number",
        ),
        pytest.param(
            "/v1/complete",
            b"{}",
            "unsupported API endpoint: /v1/complete",
            id="unclaimed-path",
        ),
    ],
)
def test_parse_request_raises_bad_request_when_request_invalid(
    path: str, body: bytes, message: str
) -> None:
    with pytest.raises(InferenceError) as info:
        PARSER.parse_request(path, body, {})
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message.startswith(message)


def test_rewrite_model_sorts_keys_when_target_given() -> None:
    payload = {"model": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    result = PARSER.parse_request("/v1/messages", orjson.dumps(payload), {})
    assert PARSER.rewrite_model(result.body, "b") == (
        b'{"max_tokens":1,"messages":[{"content":"x","role":"user"}],"model":"b"}'
    )


@pytest.mark.parametrize(
    ("chunk", "headers", "expected"),
    [
        pytest.param(
            b'{"usage":{"input_tokens":10,"output_tokens":5,"cache_read_input_tokens":4}}',
            {"content-type": "application/json"},
            Usage(prompt_tokens=10, completion_tokens=5, cached_tokens=4, total_tokens=15),
            id="json-body",
        ),
        pytest.param(
            b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
            b'{"input_tokens":25,"cache_read_input_tokens":3}}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":15}}\n\n'
            b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
            SSE,
            Usage(prompt_tokens=25, completion_tokens=15, cached_tokens=3, total_tokens=40),
            id="whole-sse-transcript",
        ),
        pytest.param(
            b'data: {"type":"message_delta","usage":{"output_tokens":15}}\n',
            SSE,
            Usage(completion_tokens=15),
            id="delta-only-leaves-total-to-merge",
        ),
        pytest.param(b'{"id":"x"}', {}, None, id="json-without-usage"),
        pytest.param(b"{broken", {}, None, id="malformed-json"),
    ],
)
def test_parse_response_extracts_usage_when_response_given(
    chunk: bytes, headers: dict[str, str], expected: Usage | None
) -> None:
    parsed = PARSER.parse_response(chunk, headers, streaming=False, end_of_stream=True)
    assert parsed.usage == expected
    assert parsed.streamed_events == 0


def test_streamed_usage_merges_to_total_when_start_and_delta_in_separate_chunks() -> None:
    state = PARSER.new_response_state(SSE)
    total = Usage()
    chunks = [
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tok',
        b'ens":25}}}\n\nevent: content_block_delta\ndata: {"type":"content_block_delta"}\n\n',
        b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":15}}\n\n',
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    for i, chunk in enumerate(chunks):
        parsed = state.feed(chunk, i == len(chunks) - 1)
        if parsed.usage is not None:
            total.merge(parsed.usage)
    assert total == Usage(prompt_tokens=25, completion_tokens=15, total_tokens=40)
