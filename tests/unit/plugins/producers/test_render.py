"""``token-producer`` backend ``vllm``: the engine's token ids from the render endpoints, served
here by the simulator (the same routes and answers as vLLM's), with the estimate as fallback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from epp.plugin import Lifecycle, RequestBody, TokenizedPrompt
from epp.plugin.params import ParamError, decode
from epp.plugins.producers.tokens import TokenProducer, estimate
from epp_tools.sim.tokenizer import render_chat, tokenize
from epp_tools.stack.envoy import free_port
from tests.builders import FakeHandle, make_request

KEY = "TokenizedPrompt/token-producer"
FALLBACKS = "llm_d_epp_token_producer_fallbacks_total"


def vllm_producer(url: str, h: FakeHandle | None = None, **vllm: Any) -> TokenProducer:
    params = decode(
        TokenProducer.Params,
        {"backend": "vllm", "modelName": "sim-model", "vllm": {"url": url, **vllm}},
    )
    return TokenProducer(name="", params=params, handle=h or FakeHandle())


def body(kind: str, payload: dict[str, Any], salt: str = "") -> RequestBody:
    return RequestBody(kind=kind, payload=payload, raw=b"", cache_salt=salt)


async def produce(p: TokenProducer, b: RequestBody) -> TokenizedPrompt | None:
    req = make_request(body=b)
    await p.produce(req, [])
    prompt: TokenizedPrompt | None = req.attributes.get(KEY)
    return prompt


@pytest.fixture
async def sim_url(sim_pods: Callable[..., Any]) -> str:
    fleet = await sim_pods(1)
    url: str = fleet.urls[0]
    return url


@pytest.fixture
async def slow_url() -> AsyncIterator[str]:
    """A server whose render answers after 2 s."""

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response([{"token_ids": [1]}])

    app = web.Application()
    app.router.add_post("/v1/completions/render", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


COMPLETION = {"model": "whatever", "prompt": "The quick brown fox jumps", "max_tokens": 3}
CHAT = {
    "model": "whatever",
    "messages": [{"role": "user", "content": "hello there"}],
    "stream": True,
    "stream_options": {"include_usage": True},
}


BOS = 7


@pytest.fixture
async def bos_url(sim_pods: Callable[..., Any]) -> str:
    """A simulated pod whose tokenizer adds a BOS token to text prompts, so the engine's tokens
    differ from the estimate: only a real render can produce them."""
    fleet = await sim_pods(1, bos_token_id=BOS)
    url: str = fleet.urls[0]
    return url


async def test_completion_tokens_equal_engine_tokens_when_rendered(bos_url: str) -> None:
    p = vllm_producer(bos_url)
    try:
        prompt = await produce(p, body("completions", COMPLETION, salt="s"))
    finally:
        await p.stop()
    assert prompt is not None
    assert list(prompt.token_ids()) == [BOS, *tokenize(COMPLETION["prompt"])]
    assert prompt.cache_salt == "s"
    assert prompt != estimate(body("completions", COMPLETION, salt="s"))


async def test_chat_tokens_include_the_template_when_rendered(sim_url: str) -> None:
    p = vllm_producer(sim_url)
    try:
        prompt = await produce(p, body("chat", CHAT))
    finally:
        await p.stop()
    assert prompt is not None
    assert list(prompt.token_ids()) == render_chat(CHAT["messages"])
    assert prompt != estimate(body("chat", CHAT))


async def test_each_prompt_is_rendered_when_completion_has_several(bos_url: str) -> None:
    p = vllm_producer(bos_url)
    try:
        prompt = await produce(
            p, body("completions", {**COMPLETION, "prompt": ["abcd", "efgh ijkl"]})
        )
    finally:
        await p.stop()
    assert prompt is not None
    assert [list(prompt.token_ids(i)) for i in range(2)] == [
        [BOS, *tokenize("abcd")],
        [BOS, *tokenize("efgh ijkl")],
    ]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        pytest.param("closed", "connection", id="connection-refused"),
        pytest.param("sim-404", "http_404", id="unknown-model"),
        pytest.param("slow", "timeout", id="timeout"),
    ],
)
async def test_estimate_is_used_and_counted_when_render_fails(
    sim_url: str, slow_url: str, target: str, reason: str
) -> None:
    h = FakeHandle()
    url = {"closed": f"http://127.0.0.1:{free_port()}", "sim-404": sim_url, "slow": slow_url}[
        target
    ]
    p = vllm_producer(url, h, timeout="200ms")
    if target == "sim-404":
        p._render.model = "no-such-model"  # type: ignore[union-attr]
    try:
        prompt = await produce(p, body("completions", COMPLETION))
    finally:
        await p.stop()
    assert prompt == estimate(body("completions", COMPLETION))
    labels = {"plugin_name": "token-producer", "reason": reason}
    assert h.registry.get_sample_value(FALLBACKS, labels) == 1


async def test_estimate_is_used_without_counting_when_api_has_no_render() -> None:
    h = FakeHandle()
    p = vllm_producer(f"http://127.0.0.1:{free_port()}", h)
    payload = {"model": "m", "input": "hi"}
    assert await produce(p, body("responses", payload)) == estimate(body("responses", payload))
    assert (
        h.registry.get_sample_value(
            FALLBACKS, {"plugin_name": "token-producer", "reason": "connection"}
        )
        is None
    )


def test_vllm_backend_is_a_lifecycle_plugin_with_its_timeout_when_configured() -> None:
    p = vllm_producer("http://127.0.0.1:1", timeout="2s", mmTimeout="9s")
    assert isinstance(p, Lifecycle)
    assert p.produce_timeout() == 9.0


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param(
            {"backend": "vllm"},
            "modelName is required with the vllm backend",
            id="model-name-missing",
        ),
        pytest.param(
            {"backend": "vllm", "modelName": "m", "vllm": {"url": "localhost:8000"}},
            "vllm: vllm\\.url must be an http\\(s\\) URL, got 'localhost:8000'",
            id="url-not-http",
        ),
        pytest.param(
            {"backend": "vllm", "modelName": "m", "vllm": {"timeout": "0s"}},
            "vllm: vllm\\.timeout must be > 0, got '0s'",
            id="timeout-zero",
        ),
        pytest.param(
            {"backend": "vllm", "modelName": "m", "vllm": {"port": 1}},
            "vllm\\.port: unknown field \\(known: mmTimeout, timeout, url\\)",
            id="unknown-key",
        ),
    ],
)
def test_vllm_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(TokenProducer.Params, params)
