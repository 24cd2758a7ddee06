from __future__ import annotations

from typing import Any

import orjson
import pytest
import xxhash

from epp.plugin import DataProducer, NoParams, RequestBody, TokenizedPrompt
from epp.plugin.params import ParamError, decode
from epp.plugins.parsers.openai import OpenAIParser
from epp.plugins.producers.tokens import IMAGE_PLACEHOLDERS, TokenProducer, estimate
from tests.builders import handle, make_request

KEY = "TokenizedPrompt/token-producer"


def _producer(name: str = "", **params: Any) -> TokenProducer:
    return TokenProducer(name=name, params=decode(TokenProducer.Params, params), handle=handle())


def _body(kind: str, payload: dict[str, Any] | None, **kw: Any) -> RequestBody:
    return RequestBody(kind=kind, payload=payload, raw=b"", **kw)


def _padded(raw: bytes) -> bytes:
    return raw + b"\0" * (-len(raw) % 4)


def _json(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


TOOLS = [{"type": "function", "function": {"name": "f"}}]


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        pytest.param("completions", {"prompt": "hello there"}, [b"hello there"], id="completions"),
        pytest.param(
            "completions", {"prompt": ["ab", "cdefg"]}, [b"ab", b"cdefg"], id="prompt-list"
        ),
        pytest.param(
            "chat",
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user"}]},
            [b"systembe briefuser"],
            id="chat-string-content",
        ),
        pytest.param(
            "chat",
            {
                "tools": TOOLS,
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "x"}]}
                ],
            },
            [_json(TOOLS) + b"usera"],
            id="chat-tools-and-blocks",
        ),
        pytest.param(
            "responses",
            {"instructions": "be kind", "input": "hi"},
            [b'[{"instructions":"be kind"},{"input":"hi"}]'],
            id="responses",
        ),
        pytest.param(
            "responses",
            {"tools": TOOLS, "input": [{"role": "user", "content": "hi"}]},
            [_json([{"tools": TOOLS}, {"input": [{"role": "user", "content": "hi"}]}])],
            id="responses-tools",
        ),
        pytest.param("embeddings", {"input": "text"}, [b'"text"'], id="embeddings"),
        pytest.param(
            "conversations", {"items": [{"type": "message"}]}, [b'[{"type":"message"}]'], id="conv"
        ),
        pytest.param(
            "anthropic-messages",
            {
                "tools": TOOLS,
                "system": [
                    {"type": "text", "text": "x-anthropic-billing-header: 123"},
                    {"type": "text", "text": "sys"},
                ],
                "messages": [
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "thinking", "thinking": "hmm"},
                            {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "content": [
                                    {"type": "text", "text": "r1"},
                                    {"type": "text", "text": "r2"},
                                ],
                            }
                        ],
                    },
                ],
            },
            [_json(TOOLS) + b'sysuserqassistanthmmt1f{"x":1}userr1\nr2'],
            id="anthropic",
        ),
        pytest.param(
            "anthropic-messages",
            {"system": "plain", "messages": [{"role": "user", "content": "q"}]},
            [b"plainuserq"],
            id="anthropic-string-system",
        ),
    ],
)
def test_estimate_serialises_prompt_when_body_kind_known(
    kind: str, payload: dict[str, Any], expected: list[bytes]
) -> None:
    prompt = estimate(_body(kind, payload))
    assert prompt is not None
    assert prompt.prompts == tuple(_padded(e) for e in expected)


@pytest.mark.parametrize(
    ("text", "expected_ids"),
    [
        pytest.param("abcd", [0x64636261], id="one-token"),
        pytest.param("abcde", [0x64636261, 0x65], id="zero-padded-tail"),
        pytest.param("", [], id="empty"),
    ],
)
def test_estimate_packs_four_bytes_per_token_when_text(text: str, expected_ids: list[int]) -> None:
    prompt = estimate(_body("completions", {"prompt": text}))
    assert prompt is not None
    assert list(prompt.token_ids()) == expected_ids
    assert prompt.token_count == len(expected_ids)


@pytest.mark.parametrize(
    ("kind", "payload"),
    [
        pytest.param("vllm-generate", {"token_ids": [1, 2, 3]}, id="vllm-generate"),
        pytest.param("completions", {"prompt": [1, 2, 3]}, id="completions-ids"),
        pytest.param("embeddings", {"input": [1, 2, 3]}, id="embeddings-ids"),
    ],
)
def test_estimate_passes_token_ids_through_when_pretokenized(
    kind: str, payload: dict[str, Any]
) -> None:
    prompt = estimate(_body(kind, payload, token_ids=(1, 2, 3), cache_salt="s"))
    assert prompt == TokenizedPrompt.from_token_ids([[1, 2, 3]], cache_salt="s")
    assert list(prompt.token_ids()) == [1, 2, 3]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(_body("raw", None), id="raw"),
        pytest.param(_body("anthropic-count-tokens", None), id="count-tokens"),
        pytest.param(_body("images", {"prompt": "a cat"}), id="images"),
    ],
)
def test_estimate_returns_none_when_nothing_to_tokenize(body: RequestBody) -> None:
    assert estimate(body) is None


def test_estimate_aligns_and_repeats_placeholder_when_image_block() -> None:
    url = "https://example.com/cat.png"
    payload = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}],
            }
        ]
    }
    prompt = estimate(_body("chat", payload))
    assert prompt is not None
    token = xxhash.xxh64_intdigest(url.encode()) & 0xFFFFFFFF
    ids = list(prompt.token_ids())
    assert ids[:2] == [int.from_bytes(b"user", "little"), token]
    assert ids[1:] == [token] * IMAGE_PLACEHOLDERS


def test_estimate_separates_images_when_urls_differ() -> None:
    def ids(url: str) -> list[int]:
        block = {"type": "image_url", "image_url": {"url": url}}
        prompt = estimate(_body("chat", {"messages": [{"role": "u", "content": [block]}]}))
        assert prompt is not None
        return list(prompt.token_ids())

    assert ids("a") != ids("b")
    assert ids("a") == ids("a")


def test_estimate_carries_cache_salt_when_present() -> None:
    prompt = estimate(_body("completions", {"prompt": "x"}, cache_salt="tenant"))
    assert prompt is not None
    assert prompt.cache_salt == "tenant"


async def test_produce_sets_attribute_when_body_parsed() -> None:
    producer = _producer()
    request = make_request(body=_body("completions", {"prompt": "abcdefgh"}))
    await producer.produce(request, [])
    assert request.attributes[KEY].prompts == (b"abcdefgh",)


@pytest.mark.parametrize(
    "body",
    [pytest.param(None, id="no-body"), pytest.param(_body("raw", None), id="raw-body")],
)
async def test_produce_leaves_attribute_unset_when_nothing_to_tokenize(
    body: RequestBody | None,
) -> None:
    request = make_request(body=body)
    await _producer().produce(request, [])
    assert request.attributes == {}


@pytest.mark.parametrize(
    ("name", "key"),
    [
        pytest.param("", KEY, id="default-name"),
        pytest.param("tok", "TokenizedPrompt/tok", id="custom-name"),
    ],
)
def test_produces_names_its_key_when_constructed(name: str, key: str) -> None:
    producer = _producer(name)
    assert isinstance(producer, DataProducer)
    assert producer.produces() == frozenset({key})


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param(
            {"backend": "tiktoken"},
            "backend: must be one of 'estimate', 'vllm', got 'tiktoken'",
            id="unknown-backend",
        ),
        pytest.param(
            {"vllm": {"port": 1}},
            "vllm\\.port: unknown field \\(known: mmTimeout, timeout, url\\)",
            id="unknown-field",
        ),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(TokenProducer.Params, params)


def test_tokenized_prompt_rejects_prompt_when_not_token_aligned() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        TokenizedPrompt((b"abc",))


@pytest.mark.parametrize(
    ("path", "body", "expected_ids"),
    [
        pytest.param(
            "/v1/chat/completions",
            b'{"model":"m","messages":[{"role":"user","content":"abcd"}]}',
            [int.from_bytes(b"user", "little"), int.from_bytes(b"abcd", "little")],
            id="chat",
        ),
        pytest.param("/v1/completions", b'{"model":"m","prompt":[7,8]}', [7, 8], id="token-ids"),
    ],
)
def test_estimate_reads_parser_output_when_body_parsed_by_openai_parser(
    path: str, body: bytes, expected_ids: list[int]
) -> None:
    parsed = OpenAIParser(name="", params=NoParams(), handle=handle()).parse_request(path, body, {})
    prompt = estimate(parsed.body)
    assert prompt is not None
    assert list(prompt.token_ids()) == expected_ids


@pytest.mark.parametrize(
    "ids",
    [pytest.param([-1], id="negative"), pytest.param([2**32], id="too-large")],
)
def test_from_token_ids_rejects_id_when_outside_uint32(ids: list[int]) -> None:
    with pytest.raises(OverflowError, match="unsigned int"):
        TokenizedPrompt.from_token_ids([ids])
