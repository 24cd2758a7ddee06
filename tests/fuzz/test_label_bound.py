"""Client-chosen model names cannot grow memory or /metrics (epp.observability.labels).

10,000 distinct model names nobody serves (and 10,000 fairness ids) leave RSS within 20 MB of the
start and /metrics under 1 MB; no model name appears in it, and only the first 64 fairness ids do.
The names go through the Director exactly as the ext_proc server drives it (request, routing, a
404 from the model server as vLLM answers, completion); the gRPC path is measured by
``epp bench fuzz --model-names 10000``."""

from __future__ import annotations

import asyncio
import gc
import json
import os

import aiohttp

from epp.app import App
from epp_tools.stack.procs import rss_bytes
from tests.fuzz.conftest import FuzzTarget

NAMES = int(os.environ.get("EPP_FUZZ_MODEL_NAMES", "10000"))
MB = 1 << 20


async def page(app: App) -> bytes:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as r,
    ):
        return await r.read()


async def send(app: App, model: str, status: str, tenant: str = "t") -> None:
    director = app.director
    ex = director.begin({":path": "/v1/chat/completions", "x-llm-d-inference-fairness-id": tenant})
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    await director.route(ex, body.encode(), {})
    director.on_response_headers(ex, {":status": status, "content-type": "application/json"}, "")
    answer = b'{"error": {"message": "The model does not exist."}}'
    if status == "200":
        answer = json.dumps({"model": model, "usage": {"completion_tokens": 2}}).encode()
    director.on_response_chunk(ex, answer, True, hold_limit=None)
    # Let the loop turn, as it does between requests in the server: asyncio drops the timers
    # of finished ``asyncio.timeout`` blocks (producer budgets) only when it runs.
    await asyncio.sleep(0)


def rss() -> int:
    gc.collect()
    return rss_bytes(os.getpid())


async def test_distinct_unknown_model_names_keep_rss_and_metrics_bounded(
    fuzz_target: FuzzTarget,
) -> None:
    app = fuzz_target.app
    await send(app, "m", "200")  # the pool's own model, confirmed by a 2xx
    for i in range(200):  # warm-up: caches, first series of every family
        await send(app, f"warm-{i}", "404")
    before, start = rss(), await page(app)
    for i in range(NAMES):
        await send(app, f"unknown-{i:05d}-{'x' * 40}", "404", tenant=f"tenant-{i}")
    grown, end = rss() - before, await page(app)
    assert grown < 20 * MB, f"RSS grew {grown / MB:.1f} MB"
    assert len(end) < 1 * MB
    assert b"unknown-0" not in end and b"warm-" not in end
    assert b'model_name="unknown"' in end and b'model_name="m"' in end
    # fairness ids are tenants: the first 64 are labels, the rest read "other"
    tenants = {line.split(b'fairness_id="')[1].split(b'"')[0] for line in end.splitlines()
               if line.startswith(b"llm_d_epp_request_total{")}  # fmt: skip
    assert len(tenants) == 64 + 1 and b"other" in tenants  # 64 values ("t" among them) + other
    assert len(end) - len(start) < 64 << 10  # those tenants' counters; no per-model series
