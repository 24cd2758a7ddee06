"""/metrics over HTTP, overrides and fault injection."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

MODEL = "m-8b"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]+="[^"]*",?)*\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_]+)="([^"]*)"')
TYPE = re.compile(r"^# TYPE (\S+) (gauge|counter|histogram)$")


def parse(text: str) -> tuple[dict[str, str], list[tuple[str, dict[str, str], float]]]:
    types: dict[str, str] = {}
    samples: list[tuple[str, dict[str, str], float]] = []
    for line in text.splitlines():
        if m := TYPE.match(line):
            types[m[1]] = m[2]
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m is not None, line
            samples.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return types, samples


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    configs = [
        PodConfig(name="v", model=MODEL, time_scale=200.0, lora_adapters=("l1", "l2"), max_loras=2),
        PodConfig(name="s", model=MODEL, time_scale=200.0, engine="sglang"),
    ]
    async with SimFleet(configs) as f:
        yield f


@pytest.fixture
async def http(fleet: SimFleet) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def metrics(http: aiohttp.ClientSession, url: str) -> tuple[dict[str, str], list[Any]]:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return parse(await resp.text())


def value(samples: list[Any], name: str, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and labels.items() <= lab.items()]
    assert len(found) == 1, (name, labels, found)
    return float(found[0])


async def complete(http: aiohttp.ClientSession, url: str, **body: Any) -> aiohttp.ClientResponse:
    payload = {"model": MODEL, "prompt": "p" * 200, "max_tokens": 3, **body}
    async with http.post(f"{url}/v1/completions", json=payload) as resp:
        await resp.read()
        return resp


async def test_vllm_metrics_have_names_labels_and_types_when_scraped(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    await complete(http, fleet.urls[0])
    await complete(http, fleet.urls[0])
    types, samples = await metrics(http, fleet.urls[0])
    expected_types = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
        "vllm:cache_config_info": "gauge",
        "vllm:lora_requests_info": "gauge",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:prompt_tokens_total": "counter",
        "vllm:generation_tokens_total": "counter",
        "vllm:request_success_total": "counter",
    }
    assert {k: types.get(k) for k in expected_types} == expected_types
    base = {"engine": "0", "model_name": MODEL}
    assert value(samples, "vllm:num_requests_running", **base) == 0.0
    assert value(samples, "vllm:prefix_cache_queries_total", **base) == 100.0
    assert value(samples, "vllm:prefix_cache_hits_total", **base) == 48.0  # 3 blocks of 16
    assert value(samples, "vllm:generation_tokens_total", **base) == 6.0
    assert value(samples, "vllm:request_success_total", finished_reason="length") == 2.0
    assert value(samples, "vllm:e2e_request_latency_seconds_count", **base) == 2.0
    info = next(lab for n, lab, _ in samples if n == "vllm:cache_config_info")
    assert (info["block_size"], info["num_gpu_blocks"]) == ("16", "28000")
    assert (info["enable_prefix_caching"], info["prefix_caching_hash_algo"]) == ("True", "sha256")
    lora = [(lab, v) for n, lab, v in samples if n == "vllm:lora_requests_info"]
    assert lora[0][0] == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert abs(lora[0][1] - time.time()) < 60


async def test_sglang_metrics_use_sglang_names_when_engine_is_sglang(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    types, samples = await metrics(http, fleet.urls[1])
    assert types["sglang:num_queue_reqs"] == "gauge"
    assert value(samples, "sglang:num_running_reqs", model_name=MODEL) == 0.0
    assert value(samples, "sglang:token_usage", model_name=MODEL) == 0.0
    info = next(lab for n, lab, _ in samples if n == "sglang:cache_config_info")
    assert (info["page_size"], info["num_pages"]) == ("16", "28000")
    assert not any(n.startswith("vllm:") for n, _, _ in samples)


async def test_overrides_pin_reported_values_until_cleared(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    pins = {
        "num_requests_waiting": 3,
        "num_requests_running": 1,
        "kv_cache_usage_perc": 0.2,
        "running_lora_adapters": ["l1"],
        "waiting_lora_adapters": ["l2"],
        "max_lora": 4,
    }
    async with http.post(f"{url}/sim/overrides", json=pins) as resp:
        assert (resp.status, await resp.json()) == (200, pins)
    _, samples = await metrics(http, url)
    assert value(samples, "vllm:num_requests_waiting") == 3.0
    assert value(samples, "vllm:num_requests_running") == 1.0
    assert value(samples, "vllm:kv_cache_usage_perc") == 0.2
    newest = max((v, lab) for n, lab, v in samples if n == "vllm:lora_requests_info")[1]
    assert newest == {"max_lora": "4", "running_lora_adapters": "l1", "waiting_lora_adapters": "l2"}
    async with http.post(f"{url}/sim/overrides", json={}) as resp:
        assert await resp.json() == {}
    _, samples = await metrics(http, url)
    assert value(samples, "vllm:num_requests_waiting") == 0.0


async def test_overrides_reject_bad_values_when_posted(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    async with http.post(f"{fleet.urls[0]}/sim/overrides", json={"kv_cache_usage_perc": 7}) as r:
        assert r.status == 400


async def set_faults(http: aiohttp.ClientSession, url: str, faults: dict[str, Any]) -> None:
    async with http.post(f"{url}/sim/faults", json=faults) as resp:
        assert resp.status == 200


async def test_error_rate_returns_error_status_when_fault_is_set(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"error_rate": 1.0, "error_status": 429})
    resp = await complete(http, url)
    assert (resp.status, resp.headers["x-sim-pod"]) == (429, "v")
    await set_faults(http, url, {})
    assert (await complete(http, url)).status == 200


async def test_error_rate_fails_about_that_share_when_fraction_is_set(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"error_rate": 0.5})
    statuses = [(await complete(http, url, max_tokens=1)).status for _ in range(40)]
    assert 5 <= statuses.count(503) <= 35
    assert statuses.count(503) + statuses.count(200) == 40


async def test_slow_ms_delays_answers_when_fault_is_set(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"slow_ms": 300})
    started = time.monotonic()
    assert (await complete(http, url, max_tokens=1)).status == 200
    assert time.monotonic() - started >= 0.3


async def test_drop_connection_cuts_socket_when_fault_is_set(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"drop_connection_rate": 1.0})
    with pytest.raises(aiohttp.ClientError):
        await complete(http, url)
    await set_faults(http, url, {})
    async with http.get(f"{url}/sim/stats") as resp:
        assert (await resp.json())["dropped_connections"] == 1


async def test_stall_metrics_hangs_scrapes_until_cleared(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"stall_metrics": True})
    with pytest.raises(asyncio.TimeoutError):
        async with http.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=0.3)):
            pass
    pending = asyncio.ensure_future(metrics(http, url))
    await asyncio.sleep(0.1)
    assert not pending.done()
    await set_faults(http, url, {})
    types, _ = await asyncio.wait_for(pending, 5)
    assert types["vllm:num_requests_running"] == "gauge"
    async with http.get(f"{url}/sim/stats") as resp:
        assert (await resp.json())["stalled_scrapes"] == 2


async def test_die_mid_stream_cuts_after_n_chunks_when_fault_is_set(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"die_mid_stream_after_chunks": 3})
    body = {"model": MODEL, "prompt": "x", "max_tokens": 10, "stream": True}
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(f"{url}/v1/completions", json=body) as resp:
            assert resp.status == 200
            async for piece in resp.content.iter_any():
                received += piece
    assert received.count(b"data: ") == 3
    assert b"[DONE]" not in received
    async with http.get(f"{url}/sim/stats") as resp:
        stats = await resp.json()
    assert stats["streams_cut"] == 1
    assert stats["running"] == 0  # the aborted request released its slot


@pytest.mark.parametrize(
    ("faults", "status", "is_metrics_page"),
    [
        pytest.param({"metrics_status": 503}, 503, False, id="status"),
        pytest.param({"metrics_garbage": True}, 200, False, id="garbage"),
        pytest.param({"metrics_delay_ms": 1}, 200, True, id="delay"),
    ],
)
async def test_metrics_faults_change_only_the_metrics_answer(
    fleet: SimFleet,
    http: aiohttp.ClientSession,
    faults: dict[str, Any],
    status: int,
    is_metrics_page: bool,
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, faults)
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == status
        assert (b"vllm:num_requests_running" in await resp.read()) is is_metrics_page
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        assert resp.status == 200
    await set_faults(http, url, {})


async def test_black_hole_holds_every_request_until_cleared(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    await set_faults(http, url, {"black_hole": True})
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    held = asyncio.ensure_future(http.post(f"{url}/v1/completions", json=body))
    scrape = asyncio.ensure_future(metrics(http, url))
    done, _ = await asyncio.wait({held, scrape}, timeout=0.3)
    assert not done
    await set_faults(http, url, {})
    resp = await asyncio.wait_for(held, 5)
    assert resp.status == 200
    resp.release()
    types, _ = await asyncio.wait_for(scrape, 5)
    assert types["vllm:num_requests_running"] == "gauge"
