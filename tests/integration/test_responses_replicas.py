"""Responses API continuity across active-active replicas: two EPP replicas share one real
``redis-server``, each behind its own Envoy. A streamed ``/v1/responses`` request goes through
replica A; its follow-up goes through replica B the moment the answer has been read, and must
reach the simulated pod that stored the previous response (any other pod answers 404).

The sync interval is 5 s, so only what makes sharing prompt can pass: A binds the response id on
the stream's first event (``ResponseStreaming``), asks for publication at once
(``Handle.share_soon``), and B's waiting receive (``XREAD BLOCK``) applies it as it lands, while
the rest of the answer streams (about 0.9 s)."""

from __future__ import annotations

import random
import re
from typing import Any

import aiohttp
import pytest
import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT
from tests.conftest import metrics_text

pytestmark = [pytest.mark.envoy]

CONVERSATIONS = 8
_ID = re.compile(rb'"id":\s*"(resp_[0-9a-zA-Z]+)"')


def config(url: str) -> str:
    """The built-in default (which runs response-affinity-filter first) plus the syncer."""
    doc = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    for key in ("apiVersion", "kind", "dataLayer"):
        doc.pop(key, None)
    sources = ("metrics-data-source", "core-metrics-extractor")
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in sources]
    refs = [r["pluginRef"] for r in doc["schedulingProfiles"][0]["plugins"]]
    assert refs[0] == "response-affinity-filter", refs
    doc["plugins"].append({"type": "redis-syncer", "parameters": {"url": url, "timeout": "500ms"}})
    doc["dataLayer"] = {
        "crossReplicaSyncerPluginRef": "redis-syncer",
        "crossReplicaSyncInterval": "5s",
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


async def turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, str, str]:
    async with session.post(f"{url}/v1/responses", json=body) as r:
        data = await r.read()  # the whole stream: the answer is complete
        match = _ID.search(data)
        return r.status, r.headers.get("x-sim-pod", ""), match.group(1).decode() if match else ""


async def test_a_follow_up_sent_to_the_other_replica_at_once_reaches_the_same_pod(
    start_app: Any, sim_pods: Any, envoy: Any, redis_server: Any
) -> None:
    server = redis_server()
    # 30 ms per output token: a 32-token answer gives the binding about 0.9 s to reach B, which
    # a loaded machine needs (both replicas share this process's event loop); still far under
    # the 5 s sync interval, so only prompt sharing passes.
    fleet = await sim_pods(4, time_scale=0.2)
    a = await start_app(fleet.ports, config(server.url), seed=1)
    b = await start_app(fleet.ports, config(server.url), seed=2)
    via_a, via_b = envoy(a), envoy(b)
    rng = random.Random(5)
    rows = []
    async with aiohttp.ClientSession() as session:
        for _ in range(CONVERSATIONS):
            words = " ".join(f"w{rng.randrange(10**6)}" for _ in range(120))
            first = {"model": "sim-model", "input": words, "stream": True, "max_output_tokens": 32}
            status, pod, rid = await turn(session, via_a.url, first)
            assert status == 200 and rid, (status, rid)
            follow = {
                "model": "sim-model",
                "input": f"and then {rng.randrange(10**6)}",  # unrelated: no prefix to match
                "previous_response_id": rid,
                "stream": True,
                "max_output_tokens": 4,
            }
            f_status, f_pod, _ = await turn(session, via_b.url, follow)
            rows.append((f_status, "same" if f_pod == pod else f_pod))
    assert rows == [(200, "same")] * CONVERSATIONS
    text = await metrics_text(b)
    hits = 'llm_d_epp_response_affinity_lookups_total{outcome="hit",plugin_name='
    assert any(
        line.startswith(hits) and line.endswith(f" {CONVERSATIONS}.0") for line in text.splitlines()
    ), text
