from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.plugin import ErrorCode, InferenceError, Parser, Usage
from epp.plugins.parsers.vllmhttp import VllmHttpParser

PARSER = VllmHttpParser(name=VllmHttpParser.TYPE, params=VllmHttpParser.Params(), handle=None)
PATH = "/inference/v1/generate"


def test_parser_satisfies_contract_when_built_without_handle() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "vllmhttp-parser"
    assert PARSER.supports_model_rewrite is True
    assert PARSER.claims() == ("inference/v1/generate",)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        pytest.param(
            {
                "model": "m",
                "token_ids": [1, 2, 3],
                "sampling_params": {"max_tokens": 16},
                "stream": True,
                "cache_salt": "salt",
            },
            ("m", (1, 2, 3), 16, True, "salt"),
            id="all-fields",
        ),
        pytest.param(
            {"token_ids": [0, 4294967295.0], "sampling_params": {"max_tokens": "9"}},
            ("", (0, 4294967295), None, False, ""),
            id="float-ids-and-string-cap",
        ),
        pytest.param(
            {
                "model": "m",
                "token_ids": [7],
                "features": {
                    "mm_hashes": {"image": ["h1", "h2"]},
                    "mm_placeholders": {"image": [{"offset": 0, "length": 1}]},
                },
            },
            ("m", (7,), None, False, ""),
            id="multimodal-features",
        ),
    ],
)
def test_parse_request_extracts_fields_when_generate_body_valid(
    payload: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    body = orjson.dumps(payload)
    result = PARSER.parse_request(PATH, body, {})
    b = result.body
    assert (result.model, b.token_ids, b.max_output_tokens, b.stream, b.cache_salt) == expected
    assert b.kind == "vllm-generate"
    assert b.payload == payload
    assert b.raw is body


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(
            PATH, b"{]", "error unmarshaling request bodyMap: unexpected character", id="bad-json"
        ),
        pytest.param(
            PATH,
            b"1",
            "error unmarshaling request bodyMap: request body must be a JSON object, got number",
            id="number-body",
        ),
        pytest.param(
            PATH,
            b'{"model": "m"}',
            "invalid generate request: must have non-empty token_ids field",
            id="missing-token-ids",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": []}',
            "invalid generate request: must have non-empty token_ids field",
            id="empty-token-ids",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": "1 2"}',
            "invalid generate request: token_ids must be an array, got string",
            id="token-ids-string",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": [1, 4294967296]}',
            "invalid generate request: token_ids must hold unsigned 32-bit integers",
            id="token-id-overflow",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": [1, true]}',
            "invalid generate request: token_ids[1] must be an unsigned 32-bit integer",
            id="token-id-boolean",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": [1], "features": {"mm_hashes": {"image": [1]}}}',
            "invalid generate request: features.mm_hashes.image[0] must be a string",
            id="hash-not-string",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": [1], "features": {"mm_placeholders": {"image": [{"offset": "0"}]}}}',
            "invalid generate request: features.mm_placeholders.image[0].offset must be an integer",
            id="placeholder-offset-string",
        ),
        pytest.param(
            PATH,
            b'{"token_ids": [1], "sampling_params": []}',
            "invalid generate request: sampling_params must be an object, got array",
            id="sampling-params-array",
        ),
        pytest.param(
            "/v1/generate",
            b'{"token_ids": [1]}',
            "unsupported path: /v1/generate",
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
    body = b'{"token_ids":[1],"model":"a","sampling_params":{"top_p":1,"max_tokens":2}}'
    result = PARSER.parse_request(PATH, body, {})
    assert PARSER.rewrite_model(result.body, "b") == (
        b'{"model":"b","sampling_params":{"max_tokens":2,"top_p":1},"token_ids":[1]}'
    )


@pytest.mark.parametrize(
    ("chunk", "headers", "expected"),
    [
        pytest.param(
            b'{"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}',
            {"content-type": "application/json"},
            Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
            id="json",
        ),
        pytest.param(
            b'data: {"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
            b"data: [DONE]\n\n",
            {"content-type": "text/event-stream"},
            Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5),
            id="sse",
        ),
    ],
)
def test_parse_response_uses_openai_usage_when_response_given(
    chunk: bytes, headers: dict[str, str], expected: Usage
) -> None:
    parsed = PARSER.parse_response(chunk, headers, streaming=False, end_of_stream=True)
    assert parsed.usage == expected
