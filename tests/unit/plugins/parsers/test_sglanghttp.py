from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP, ErrorCode, InferenceError, Parser, Usage
from epp.plugin.testing import check_parser
from epp.plugins.parsers.sglanghttp import SGLangHttpParser

PARSER = SGLangHttpParser(name=SGLangHttpParser.TYPE, params=SGLangHttpParser.Params(), handle=None)
PATH = "/generate"
SSE = {"content-type": "text/event-stream"}


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "sglanghttp-parser"
    assert PARSER.supports_model_rewrite is False
    assert PARSER.claims() == ("generate",)
    assert set(PARSER.app_protocols()) == {APP_PROTOCOL_HTTP, APP_PROTOCOL_H2C}
    check_parser(PARSER, PATH, b'{"input_ids":[1,2]}', b'{"input_ids":"1 2"}')


@pytest.mark.parametrize(
    ("path", "payload", "expected"),
    [
        pytest.param(
            PATH,
            {
                "input_ids": [1, 2, 3],
                "sampling_params": {"max_new_tokens": 16, "temperature": 0},
                "stream": True,
                "extra_key": "tenant-a",
            },
            ((1, 2, 3), 16, True, "tenant-a"),
            id="all-fields",
        ),
        pytest.param(
            "/generate?x=1",
            {"input_ids": [0, 4294967295.0], "sampling_params": {"max_new_tokens": -1}},
            ((0, 4294967295), None, False, ""),
            id="query-float-ids-negative-cap",
        ),
        pytest.param(
            "/generate/", {"input_ids": [7], "stream": 1}, ((7,), None, False, ""), id="slash"
        ),
    ],
)
def test_parse_request_extracts_fields_when_generate_body_valid(
    path: str, payload: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    body = orjson.dumps(payload)
    result = PARSER.parse_request(path, body, {})
    b = result.body
    assert (b.token_ids, b.max_output_tokens, b.stream, b.cache_salt) == expected
    assert (result.model, b.kind, result.skip_response_processing) == ("", "sglang-generate", False)
    assert b.payload == payload
    assert b.raw is body


def test_rewrite_model_forwards_the_body_untouched() -> None:
    body = b'{"input_ids": [1], "model": "a"}'
    result = PARSER.parse_request(PATH, body, {})
    assert PARSER.rewrite_model(result.body, "b") is body


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(PATH, b"{]", "error unmarshaling request bodyMap: ", id="bad-json"),
        pytest.param(
            PATH,
            b"[1, 2]",
            "error unmarshaling request bodyMap: request body must be a JSON object, got array",
            id="array-body",
        ),
        pytest.param(
            PATH,
            b'{"text": "hello"}',
            "invalid generate request: must have non-empty input_ids field",
            id="text-only",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": []}',
            "invalid generate request: must have non-empty input_ids field",
            id="empty-ids",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": "1 2"}',
            "invalid generate request: input_ids must be an array, got string",
            id="ids-string",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": [1, -2]}',
            "invalid generate request: input_ids must hold unsigned 32-bit integers",
            id="negative-id",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": [1, "2"]}',
            "invalid generate request: input_ids[1] must be an unsigned 32-bit integer",
            id="string-id",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": [[1], [2]]}',
            "invalid generate request: batched input_ids (an array of arrays) are not supported",
            id="batch",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": [1], "extra_key": 5}',
            "invalid generate request: extra_key must be a string, got number",
            id="extra-key-number",
        ),
        pytest.param(
            PATH,
            b'{"input_ids": [1], "sampling_params": [16]}',
            "invalid generate request: sampling_params must be an object, got array",
            id="sampling-params-array",
        ),
        pytest.param(
            "/v1/generate", b'{"input_ids": [1]}', "unsupported path: /v1/generate", id="path"
        ),
    ],
)
def test_parse_request_raises_bad_request_when_request_invalid(
    path: str, body: bytes, message: str
) -> None:
    with pytest.raises(InferenceError) as info:
        PARSER.parse_request(path, body, {})
    assert info.value.code is ErrorCode.BAD_REQUEST
    assert info.value.message.startswith(message), info.value.message


BODY = (
    b'{"text":"ok","output_ids":[5,6],"meta_info":{"id":"1","finish_reason":{"type":"length",'
    b'"length":2},"prompt_tokens":7,"completion_tokens":2,"cached_tokens":4}}'
)
STREAM = (
    b'data: {"text":"o","meta_info":{"finish_reason":null,"prompt_tokens":7,'
    b'"completion_tokens":1,"cached_tokens":4}}\n\n'
    b'data: {"text":"ok","meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 7, '
    b'"completion_tokens": 2, "cached_tokens": 4}}\n\n'
    b'data: {"text":"ok","meta_info":{"finish_reason":{"type":"stop"},"prompt_tokens":99,'
    b'"completion_tokens":99}}\n\n'
    b"data: [DONE]\n\n"
)
USAGE = Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=4, total_tokens=9)


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        pytest.param(BODY, {"content-type": "application/json"}, USAGE, id="json"),
        pytest.param(STREAM, SSE, USAGE, id="sse-first-finished-event"),
        pytest.param(b'{"meta_info":{"id":"1"}}', {}, None, id="no-counts"),
        pytest.param(b'{"text":"x"}', {}, None, id="no-meta-info"),
        pytest.param(b'{"meta_info":[1]}', {}, None, id="meta-info-not-object"),
        pytest.param(b"{not json", {}, None, id="broken-json"),
        pytest.param(
            b'data: {"meta_info":{"finish_reason":null,"prompt_tokens":3}}\n\n',
            SSE,
            None,
            id="sse-unfinished",
        ),
    ],
)
def test_parse_response_reads_meta_info(
    body: bytes, headers: dict[str, str], expected: Usage | None
) -> None:
    parsed = PARSER.parse_response(body, headers, streaming=False, end_of_stream=True)
    assert parsed.usage == expected
    assert parsed.streamed_events == 0


def test_streamed_usage_found_when_events_split_across_chunks() -> None:
    state = PARSER.new_response_state(SSE)
    found = Usage()
    for i in range(0, len(STREAM), 13):
        parsed = state.feed(STREAM[i : i + 13], i + 13 >= len(STREAM))
        if parsed.usage is not None:
            found.merge(parsed.usage)
            break
    assert found == USAGE


def test_streamed_json_body_parsed_at_end_of_stream() -> None:
    state = PARSER.new_response_state({"content-type": "application/json"})
    assert state.feed(BODY[:20], False).usage is None
    assert state.feed(BODY[20:], True).usage == USAGE
