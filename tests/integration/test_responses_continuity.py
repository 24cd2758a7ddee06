"""Responses API continuity through a real Envoy: a follow-up that names only its
``previous_response_id`` reaches the simulated pod that stored that response (any other pod
answers 404). Follow-ups carry fresh, unrelated input, so prefix affinity cannot explain it."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from typing import Any

import aiohttp
import pytest
import yaml

from epp.config.schema import DEFAULT_CONFIG_TEXT, UPSTREAM_DEFAULT_CONFIG_TEXT

pytestmark = [pytest.mark.envoy]

CONVERSATIONS = 24
FOLLOW_UPS = 2
_ID = re.compile(rb'"id":\s*"(resp_[0-9a-zA-Z]+)"')


def profile_body(config_text: str, *, with_filter: bool) -> str:
    """A config's plugins and profiles (the test fixture adds discovery and data sources)."""
    doc = yaml.safe_load(config_text)
    for key in ("apiVersion", "kind", "dataLayer"):
        doc.pop(key, None)
    sources = ("metrics-data-source", "core-metrics-extractor", "response-affinity-filter")
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in sources]
    refs = [r for r in doc["schedulingProfiles"][0]["plugins"]]
    refs = [r for r in refs if r["pluginRef"] != "response-affinity-filter"]
    if with_filter:
        doc["plugins"].insert(0, {"type": "response-affinity-filter"})
        refs.insert(0, {"pluginRef": "response-affinity-filter"})
    doc["schedulingProfiles"][0]["plugins"] = refs
    return str(yaml.safe_dump(doc, sort_keys=False))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


async def _turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[int, str, str]:
    async with session.post(f"{url}/v1/responses", json=body) as r:
        data = await r.read()
        match = _ID.search(data)
        return r.status, r.headers.get("x-sim-pod", ""), match.group(1).decode() if match else ""


async def _conversation(url: str, index: int, gate: asyncio.Semaphore) -> list[tuple[str, ...]]:
    """Returns (turn, status, pod) rows; turn 0 is the first request."""
    rng = random.Random(index)
    stream = index % 2 == 0
    rows = []
    async with gate, aiohttp.ClientSession() as session:
        body = {"model": "sim-model", "input": _words(rng, 200), "stream": stream}
        status, first_pod, rid = await _turn(session, url, body)
        rows.append(("first", str(status), first_pod))
        for _ in range(FOLLOW_UPS):
            follow = {
                "model": "sim-model",
                "input": _words(rng, 40),
                "previous_response_id": rid,
                "stream": stream,
                "max_output_tokens": 8,
            }
            status, pod, rid = await _turn(session, url, follow)
            rows.append(("follow-up", str(status), "same" if pod == first_pod else pod))
    return rows


async def _run(
    start_app: Any, sim_pods: Any, envoy: Any, body: str, gateway: str = "full-duplex", **kw: Any
) -> list[tuple[str, ...]]:
    fleet = await sim_pods(4)
    app = await start_app(fleet.ports, body, **kw)
    proxy = envoy(app, gateway)
    gate = asyncio.Semaphore(8)
    results = await asyncio.gather(
        *(_conversation(proxy.url, i, gate) for i in range(CONVERSATIONS))
    )
    return [row for rows in results for row in rows]


@pytest.mark.parametrize(
    "config_text",
    [
        pytest.param(DEFAULT_CONFIG_TEXT, id="builtin-default"),
        pytest.param(UPSTREAM_DEFAULT_CONFIG_TEXT, id="upstream-default-plus-filter"),
    ],
)
async def test_every_follow_up_reaches_the_pod_holding_its_previous_response(
    start_app: Any, sim_pods: Any, envoy: Any, config_text: str
) -> None:
    rows = await _run(start_app, sim_pods, envoy, profile_body(config_text, with_filter=True))
    firsts = [r for r in rows if r[0] == "first"]
    follow_ups = [r for r in rows if r[0] == "follow-up"]
    assert len(follow_ups) == CONVERSATIONS * FOLLOW_UPS
    assert all(status == "200" for _, status, _ in firsts)
    assert follow_ups == [("follow-up", "200", "same")] * len(follow_ups)
    # First turns spread over the pool: no pod takes more than half of them.
    per_pod = Counter(pod for _, _, pod in firsts)
    assert max(per_pod.values()) <= CONVERSATIONS // 2, per_pod


async def test_continuity_holds_where_the_epp_skips_the_bodies_it_does_not_need(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    """Envoy's streamed config lets the EPP switch a response body off: it still reads every
    Responses API answer (the response-affinity filter needs its id), nothing else."""
    body = profile_body(DEFAULT_CONFIG_TEXT, with_filter=True)
    rows = await _run(start_app, sim_pods, envoy, body, "streamed", response_body_sample_ratio=0.0)
    follow_ups = [r for r in rows if r[0] == "follow-up"]
    assert len(follow_ups) == CONVERSATIONS * FOLLOW_UPS
    assert follow_ups == [("follow-up", "200", "same")] * len(follow_ups)


async def test_follow_ups_fail_without_the_filter_when_routing_ignores_previous_response(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    """The control: upstream's default alone loses follow-ups to 404 on other pods."""
    body = profile_body(UPSTREAM_DEFAULT_CONFIG_TEXT, with_filter=False)
    rows = await _run(start_app, sim_pods, envoy, body)
    follow_ups = [r for r in rows if r[0] == "follow-up"]
    failed = [r for r in follow_ups if r[1] == "404"]
    assert failed, "every follow-up landed on its pod by chance: the control proves nothing"
