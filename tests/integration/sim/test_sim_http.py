"""Real HTTP against simulated pods on 127.0.0.1: the OpenAI-compatible surface."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

MODEL = "sim-model"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    config = PodConfig(name="pod-a", model=MODEL, time_scale=200.0, lora_adapters=("ad1",))
    async with SimFleet([config]) as f:
        yield f


@pytest.fixture
async def http(fleet: SimFleet) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=fleet.urls[0]) as session:
        yield session


def sse_data(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def sse_event_names(text: str) -> list[str]:
    return [line[len("event: ") :] for line in text.splitlines() if line.startswith("event: ")]


async def post(http: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, Any, str]:
    async with http.post(path, json=body) as resp:
        text = await resp.text()
        pod = resp.headers.get("x-sim-pod", "")
        is_json = resp.content_type == "application/json"
        return resp.status, (json.loads(text) if is_json else text), pod


@pytest.mark.parametrize(
    ("path", "body", "obj"),
    [
        pytest.param(
            "/v1/completions",
            {"model": MODEL, "prompt": "Hello there, simulator!", "max_tokens": 5},
            "text_completion",
            id="completions",
        ),
        pytest.param(
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            "chat.completion",
            id="chat",
        ),
        pytest.param(
            "/v1/chat/completions",
            {"model": "ad1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
            "chat.completion",
            id="chat-lora",
        ),
    ],
)
async def test_non_stream_answer_has_usage_when_request_succeeds(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any], obj: str
) -> None:
    status, data, pod = await post(http, path, body)
    assert (status, pod) == (200, "pod-a")
    assert data["object"] == obj
    assert data["model"] == body["model"]
    assert data["choices"][0]["finish_reason"] == "length"
    usage = data["usage"]
    assert usage["completion_tokens"] == 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + 5
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


@pytest.mark.parametrize(
    ("path", "body", "obj", "delta_key"),
    [
        pytest.param(
            "/v1/completions",
            {"model": MODEL, "prompt": "stream me please", "max_tokens": 4},
            "text_completion",
            "text",
            id="completions",
        ),
        pytest.param(
            "/v1/chat/completions",
            {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 4},
            "chat.completion.chunk",
            "delta",
            id="chat",
        ),
    ],
)
async def test_stream_ends_with_usage_and_done_when_include_usage_is_set(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any], obj: str, delta_key: str
) -> None:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    status, text, _ = await post(http, path, body)
    assert status == 200
    events = sse_data(text)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == 4
    chunks = [e for e in events[:-2] if e["choices"]]
    assert all(c["object"] == obj and c["model"] == MODEL for c in chunks)
    assert all(delta_key in c["choices"][0] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_stream_has_no_usage_chunk_when_include_usage_is_absent(
    http: aiohttp.ClientSession,
) -> None:
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 3, "stream": True}
    _, text, _ = await post(http, "/v1/completions", body)
    events = sse_data(text)
    assert events[-1] == "[DONE]"
    assert len(events) == 4
    assert all("usage" not in e for e in events[:-1])


async def test_repeated_prompt_reports_cached_tokens_when_prefix_is_cached(
    http: aiohttp.ClientSession,
) -> None:
    body = {"model": MODEL, "prompt": "x" * 400, "max_tokens": 2}  # 100 tokens
    first = (await post(http, "/v1/completions", body))[1]
    second = (await post(http, "/v1/completions", body))[1]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 96


async def test_responses_previous_id_prepends_history_when_chained(
    http: aiohttp.ClientSession,
) -> None:
    first_body = {"model": MODEL, "input": "tell me a story " * 8, "max_output_tokens": 20}
    status, first, _ = await post(http, "/v1/responses", first_body)
    assert status == 200
    assert first["object"] == "response"
    assert first["status"] == "completed"
    text = first["output"][0]["content"][0]["text"]
    assert len(text) == 80  # 20 tokens of 4 bytes
    follow = {"model": MODEL, "input": "and then?", "previous_response_id": first["id"]}
    status, second, _ = await post(http, "/v1/responses", follow)
    assert status == 200
    assert second["previous_response_id"] == first["id"]
    used = second["usage"]
    # history (prompt + answer) is now part of the prompt and mostly served from the cache
    assert used["input_tokens"] > first["usage"]["input_tokens"] + 20
    assert used["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"]


async def test_responses_stream_emits_typed_events_when_stream_is_set(
    http: aiohttp.ClientSession,
) -> None:
    body = {"model": MODEL, "input": "stream", "max_output_tokens": 3, "stream": True}
    status, text, _ = await post(http, "/v1/responses", body)
    assert status == 200
    names = sse_event_names(text)
    assert names[0] == "response.created"
    assert names.count("response.output_text.delta") == 3
    assert names[-1] == "response.completed"
    completed = sse_data(text)[-1]["response"]
    assert completed["usage"]["output_tokens"] == 3
    follow = {"model": MODEL, "input": "more", "previous_response_id": completed["id"]}
    assert (await post(http, "/v1/responses", follow))[0] == 200


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        pytest.param("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model", id="model"),
        pytest.param(
            "/v1/responses",
            {"model": MODEL, "input": "x", "previous_response_id": "resp_missing"},
            404,
            "previous_response_id",
            id="previous-response",
        ),
        pytest.param("/v1/chat/completions", {"model": MODEL}, 400, "messages", id="no-messages"),
        pytest.param(
            "/v1/completions",
            {"model": MODEL, "prompt": "x", "max_tokens": 0},
            400,
            "max_tokens",
            id="zero-max-tokens",
        ),
    ],
)
async def test_error_is_vllm_shaped_when_request_is_invalid(
    http: aiohttp.ClientSession, path: str, body: dict[str, Any], status: int, param: str
) -> None:
    got_status, data, pod = await post(http, path, body)
    assert (got_status, pod) == (status, "pod-a")
    assert data["error"]["code"] == status
    assert data["error"]["param"] == param


async def test_bad_json_is_rejected_when_body_does_not_parse(http: aiohttp.ClientSession) -> None:
    async with http.post("/v1/completions", data=b"{not json") as resp:
        data = await resp.json()
    assert resp.status == 400
    assert data["error"]["type"] == "BadRequestError"


async def test_chunked_request_body_is_accepted_when_sent_in_pieces(
    http: aiohttp.ClientSession,
) -> None:
    raw = json.dumps({"model": MODEL, "prompt": "chunked " * 50, "max_tokens": 2}).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 37):
            yield raw[i : i + 37]

    async with http.post("/v1/completions", data=pieces()) as resp:
        assert resp.request_info.headers.get("Transfer-Encoding") == "chunked"
        data = await resp.json()
    assert resp.status == 200
    assert data["usage"]["prompt_tokens"] == 100


async def test_render_endpoints_return_token_ids_when_called(http: aiohttp.ClientSession) -> None:
    status, items, _ = await post(
        http, "/v1/completions/render", {"model": MODEL, "prompt": ["abcd", "abcdefgh"]}
    )
    assert status == 200
    assert [item["token_ids"] for item in items] == [
        [int.from_bytes(b"abcd", "little")],
        [int.from_bytes(b"abcd", "little"), int.from_bytes(b"efgh", "little")],
    ]
    assert items[0]["request_id"].startswith("cmpl-")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, rendered, _ = await post(http, "/v1/chat/completions/render", chat)
    assert status == 200
    assert rendered["model"] == MODEL
    assert rendered["sampling_params"]["max_tokens"] == 3
    _, answer, _ = await post(http, "/v1/chat/completions", chat)
    assert answer["usage"]["prompt_tokens"] == len(rendered["token_ids"])


async def test_models_lists_base_and_adapters_when_lora_is_configured(
    http: aiohttp.ClientSession,
) -> None:
    async with http.get("/v1/models") as resp:
        data = await resp.json()
    assert [(m["id"], m["parent"]) for m in data["data"]] == [(MODEL, None), ("ad1", MODEL)]


@pytest.mark.parametrize(
    ("path", "key"),
    [
        pytest.param("/server_info", "max_running_requests", id="server-info"),
        pytest.param("/model_info", "model_path", id="model-info"),
        pytest.param("/get_model_info", "is_generation", id="get-model-info"),
    ],
)
async def test_peer_router_endpoints_answer_json_when_queried(
    http: aiohttp.ClientSession, path: str, key: str
) -> None:
    async with http.get(path) as resp:
        data = await resp.json()
    assert resp.status == 200
    assert key in data


async def test_health_and_stats_answer_when_pod_is_up(http: aiohttp.ClientSession) -> None:
    await post(http, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})
    async with http.get("/health") as resp:
        assert (resp.status, resp.headers["x-sim-pod"]) == (200, "pod-a")
    async with http.get("/sim/stats") as resp:
        stats = await resp.json()
    assert stats["pod"] == "pod-a"
    assert stats["requests_served"] == 1
    assert stats["generation_tokens"] == 2


async def test_client_disconnect_aborts_request_when_stream_is_abandoned() -> None:
    config = PodConfig(name="slow", model=MODEL, time_scale=1.0)  # ~6 ms per token
    async with SimFleet([config]) as fleet, aiohttp.ClientSession() as http:
        body = {"model": MODEL, "prompt": "long answer", "max_tokens": 5000, "stream": True}
        async with http.post(f"{fleet.urls[0]}/v1/completions", json=body) as resp:
            await resp.content.readline()
            resp.close()  # hang up after the first chunk
        engine = fleet.runtime(0).engine
        for _ in range(200):
            if engine.num_running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.num_running == 0
        assert engine.stats.finished["abort"] == 1
        assert engine.pool.used_blocks == 0


async def test_diagnostic_headers_echo_body_hash_and_prefiller_when_present(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    raw = json.dumps({"model": MODEL, "prompt": "hash me", "max_tokens": 1}).encode()
    own = f"127.0.0.1:{fleet.ports[0]}"  # the pod prefills for itself: a real, local prefill leg
    headers = {
        "x-prefiller-host-port": own,
        "x-data-parallel-host-port": "127.0.0.1:8001",
        "Content-Type": "application/json",
    }
    async with http.post("/v1/completions", data=raw, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["x-sim-request-sha256"] == hashlib.sha256(raw).hexdigest()
        assert resp.headers["x-sim-saw-prefiller"] == own
        assert resp.headers["x-sim-saw-data-parallel"] == "127.0.0.1:8001"
        assert (resp.headers["x-sim-role"], resp.headers["x-sim-prefill-pod"]) == ("both", "pod-a")
    async with http.get("/health") as resp:
        assert resp.headers["x-sim-role"] == "both"
        for header in ("x-sim-request-sha256", "x-sim-saw-prefiller", "x-sim-prefill-pod"):
            assert header not in resp.headers


async def test_chat_stream_opens_with_the_first_token_when_the_prefill_is_long() -> None:
    """As vLLM does, the assistant role chunk goes out with the first token's chunk, after the
    prefill, not as soon as the request arrives: the first chunk marks the time to first token."""
    config = PodConfig(name="pod-a", model=MODEL, time_scale=1.0, prefill_tokens_per_s=4000.0)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "word " * 2000}],  # ~2,500 tokens: ~0.6 s
        "max_tokens": 2,
        "stream": True,
    }
    loop = asyncio.get_running_loop()
    async with SimFleet([config]) as f, aiohttp.ClientSession(base_url=f.urls[0]) as http:
        sent = loop.time()
        async with http.post("/v1/chat/completions", json=body) as resp:
            headers_at = loop.time()
            role = await resp.content.readuntil(b"\n\n")
            role_at = loop.time()
            token = await resp.content.readuntil(b"\n\n")
            token_at = loop.time()
            await resp.read()
    assert b'"role":"assistant"' in role and b'"content":""' in role
    assert b'"content":"' in token and b'"content":""' not in token
    assert headers_at - sent < role_at - headers_at  # the headers did not wait for the prefill
    assert role_at - headers_at > 0.3  # the role chunk did
    assert token_at - role_at < role_at - headers_at  # and came with the first token
