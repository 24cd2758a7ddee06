from __future__ import annotations

import pytest

from epp.plugin import ParsedResponse, Parser, RequestBody
from epp.plugins.parsers.passthrough import PassthroughParser

PARSER = PassthroughParser(
    name=PassthroughParser.TYPE, params=PassthroughParser.Params(), handle=None
)


def test_parser_is_fallback_without_model_rewrite_when_built() -> None:
    assert isinstance(PARSER, Parser)
    assert PARSER.typed_name.type == "passthrough-parser"
    assert PARSER.claims() == ()
    assert PARSER.supports_model_rewrite is False


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/v1/chat/completions", b'{"model":"m","messages":[]}', id="json"),
        pytest.param("/anything", b"\x00\xffbinary", id="binary"),
        pytest.param("/", b"", id="empty"),
        pytest.param("/big", b"a" * (1 << 20), id="one-mebibyte"),
    ],
)
def test_parse_request_forwards_raw_bytes_when_any_body(path: str, body: bytes) -> None:
    result = PARSER.parse_request(path, body, {})
    assert result.model == ""
    assert result.body.kind == "raw"
    assert result.body.payload is None
    assert result.body.raw is body
    assert result.skip_response_processing is False


def test_rewrite_model_returns_body_unchanged_when_called() -> None:
    body = RequestBody(kind="raw", payload=None, raw=b'{"model":"a"}')
    assert PARSER.rewrite_model(body, "b") == b'{"model":"a"}'


@pytest.mark.parametrize(
    ("chunk", "headers"),
    [
        pytest.param(b'{"usage":{"prompt_tokens":3}}', {}, id="json-usage"),
        pytest.param(b'data: {"usage":{"prompt_tokens":3}}\n\n', {}, id="sse-usage"),
    ],
)
def test_parse_response_reports_nothing_when_usage_present(
    chunk: bytes, headers: dict[str, str]
) -> None:
    assert PARSER.parse_response(chunk, headers, streaming=True, end_of_stream=True) == (
        ParsedResponse()
    )
    assert PARSER.new_response_state(headers).feed(chunk, True) == ParsedResponse()
