"""The EPP takes only the response messages it needs, through a real Envoy.

A model server that answers fixed bytes (so what the client gets can be compared byte for byte)
sits behind Envoy in three configs: ``streamed`` (request body BUFFERED, response body STREAMED,
``mode_override`` allowed to switch it off: what ``epp envoy-config --body streamed`` emits),
the same without ``allow_mode_override`` (a gateway that refuses the override), and
``full-duplex`` (FULL_DUPLEX_STREAMED, where Envoy 1.40 ignores any override). The messages are
counted from Envoy's own ext_proc stats; completion from the EPP's request metrics (the running
gauge back to zero, one duration per request, each at least as long as the answer took)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from epp_tools.stack.envoy import Envoy, free_port, render
from tests.conftest import metrics_text

pytestmark = [pytest.mark.envoy]

TOKENS = 30
PAUSE = 0.005  # between tokens: each reaches Envoy as its own chunk
_EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"sim-model",'
    b'"choices":[{"index":0,"delta":{"content":"t%d"}}]}\n\n'
)
_USAGE = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","model":"sim-model",'
    b'"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":30,"total_tokens":35}}\n\n'
)
STREAMED = [_EVENT % i for i in range(TOKENS)] + [_USAGE, b"data: [DONE]\n\n"]
WHOLE = [
    b'{"id":"chatcmpl-2","object":"chat.completion","model":"sim-model",',
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],',
    b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}',
]
CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}]}
MIN_ANSWER_SECONDS = TOKENS * PAUSE  # how long the streamed answer takes at least


async def _answer(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    stream = bool(body.get("stream"))
    kind = "text/event-stream" if stream else "application/json"
    response = web.StreamResponse(headers={"content-type": kind})
    await response.prepare(request)
    for piece in STREAMED if stream else WHOLE:
        await response.write(piece)
        await asyncio.sleep(PAUSE)
    await response.write_eof()
    return response


async def _no_metrics(request: web.Request) -> web.Response:
    return web.Response(text="", content_type="text/plain")


@pytest.fixture
async def answer_server() -> AsyncIterator[int]:
    """A model server answering fixed bytes; its port."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _answer)
    app.router.add_get("/metrics", _no_metrics)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield port
    await runner.cleanup()


def _without_override(config: str) -> str:
    """The streamed config with ``allow_mode_override`` off: Envoy sends every chunk."""
    doc = yaml.safe_load(config)

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("@type", "").endswith("ext_proc.v3.ExternalProcessor"):
                node.pop("allow_mode_override")
                node.pop("allowed_override_modes")
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(doc)
    return str(yaml.safe_dump(doc, sort_keys=False))


def start_envoy(app: Any, gateway: str) -> Envoy:
    """``streamed``, ``streamed-no-override`` or ``full-duplex`` in front of ``app``."""
    if gateway != "streamed-no-override":
        return Envoy(gateway, epp_port=app.grpc_port, epp_tls=False).start()
    listen, admin = free_port(), free_port()
    text = render(
        "streamed", listen_port=listen, admin_port=admin, epp_port=app.grpc_port, epp_tls=False
    )
    return Envoy(
        "streamed", config_text=_without_override(text), listen_port=listen, admin_port=admin
    ).start()


@pytest.fixture
def gateway() -> Iterator[Callable[[Any, str], Envoy]]:
    started: list[Envoy] = []

    def start(app: Any, name: str) -> Envoy:
        started.append(start_envoy(app, name))
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


def messages(proxy: Envoy) -> int:
    """ext_proc messages Envoy sent so far (one per request or response part it forwarded)."""
    return proxy.stats().get("http.ingress.ext_proc.stream_msgs_sent", 0)


async def ask(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json=body, headers=headers or {}) as r,
    ):
        return r.status, await r.read()


def sample(text: str, name: str) -> float:
    """The sum of a metric's samples named ``name`` (over every label set)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        total += sum(s.value for s in family.samples if s.name == name)
    return total


async def settled(app: Any, requests: int) -> str:
    """The metrics once every one of ``requests`` completed (the running gauge back at zero)."""
    for _ in range(200):
        text = await metrics_text(app)
        done = sample(text, "llm_d_epp_request_duration_seconds_count") >= requests
        if done and sample(text, "llm_d_epp_request_running") == 0:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"requests did not complete:\n{text}")


async def _streamed_answers(
    start_app: Any, gateway: Any, port: int, name: str, ratio: float
) -> tuple[float, str]:
    """Three streamed answers through ``name``: ext_proc messages per request, the metrics."""
    app = await start_app([port], response_body_sample_ratio=ratio)
    proxy = gateway(app, name)
    before = messages(proxy)
    for _ in range(3):
        status, body = await ask(proxy.url, {**CHAT, "stream": True})
        assert status == 200
        assert body == b"".join(STREAMED)  # byte for byte
    per_request = (messages(proxy) - before) / 3
    return per_request, await settled(app, 3)


async def test_a_streamed_answer_nothing_needs_costs_three_messages(
    start_app: Any, gateway: Any, answer_server: int
) -> None:
    per_request, text = await _streamed_answers(start_app, gateway, answer_server, "streamed", 0)
    # request headers, request body, response headers: no message per token
    assert per_request == 3
    # completion came at the end of each answer, not at its headers
    assert sample(text, "llm_d_epp_request_duration_seconds_sum") >= 3 * MIN_ANSWER_SECONDS
    assert sample(text, "llm_d_epp_request_ttft_seconds_count") == 0  # the body was not read


@pytest.mark.parametrize("name", ["streamed-no-override", "full-duplex"])
async def test_a_gateway_that_sends_every_chunk_is_served_byte_for_byte(
    start_app: Any, gateway: Any, answer_server: int, name: str
) -> None:
    per_request, text = await _streamed_answers(start_app, gateway, answer_server, name, 0)
    assert per_request >= TOKENS  # every chunk still came, and went back unread
    assert sample(text, "llm_d_epp_request_duration_seconds_sum") >= 3 * MIN_ANSWER_SECONDS
    assert sample(text, "llm_d_epp_request_ttft_seconds_count") == 0


async def test_a_sampled_answer_is_read_whole(
    start_app: Any, gateway: Any, answer_server: int
) -> None:
    per_request, text = await _streamed_answers(start_app, gateway, answer_server, "streamed", 1)
    assert per_request >= TOKENS
    assert sample(text, "llm_d_epp_request_ttft_seconds_count") == 3
    assert sample(text, "llm_d_epp_request_output_tokens_sum") == 3 * TOKENS


@pytest.mark.parametrize("name", ["streamed", "full-duplex"])
@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_a_rewritten_model_is_restored_in_every_chunk(
    start_app: Any, gateway: Any, answer_server: int, name: str, stream: bool
) -> None:
    app = await start_app([answer_server], response_body_sample_ratio=0)
    proxy = gateway(app, name)
    rewrite = {"x-llm-d-model-name-rewrite": "sim-model"}
    status, body = await ask(proxy.url, {**CHAT, "model": "alias", "stream": stream}, rewrite)
    assert status == 200
    expected = b"".join(STREAMED if stream else WHOLE)
    assert body == expected.replace(b'"model":"sim-model"', b'"model":"alias"')
    await settled(app, 1)


async def test_a_client_leaving_during_a_skipped_body_completes_its_request(
    start_app: Any, gateway: Any, answer_server: int
) -> None:
    app = await start_app([answer_server], response_body_sample_ratio=0)
    proxy = gateway(app, "streamed")
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r,
    ):
        assert json.loads((await r.content.readuntil(b"\n\n"))[len(b"data: ") :])["id"]
        r.close()  # gone after the first token
    text = await settled(app, 1)
    assert sample(text, "llm_d_epp_request_duration_seconds_sum") < MIN_ANSWER_SECONDS


LOAD_CONFIG = """\
plugins:
- type: kv-cache-utilization-scorer
- type: estimated-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: estimated-load-scorer
"""


async def in_flight(app: Any) -> int:
    """Requests the in-flight load producer holds open (its ``/debug/plugins/state``)."""
    url = f"http://127.0.0.1:{app.metrics_port}/debug/plugins/state"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        state = await r.json()
    (open_,) = [v["open"] for v in state.values() if isinstance(v, dict) and "open" in v]
    return int(open_)


async def test_the_in_flight_load_is_held_while_a_skipped_body_streams_and_freed_at_its_end(
    start_app: Any, gateway: Any, answer_server: int
) -> None:
    app = await start_app([answer_server], LOAD_CONFIG, response_body_sample_ratio=0)
    proxy = gateway(app, "streamed")
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{proxy.url}/v1/chat/completions", json={**CHAT, "stream": True}) as r,
    ):
        await r.content.readuntil(b"\n\n")  # the first token: the answer is under way
        assert await in_flight(app) == 1
        assert await r.read() == b"".join(STREAMED[1:])
    await settled(app, 1)
    assert await in_flight(app) == 0
