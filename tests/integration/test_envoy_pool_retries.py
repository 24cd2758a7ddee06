"""The model-server cluster and retry policy ``epp envoy-config --pool-endpoint`` writes, run by a
real Envoy under load with one of four pods dead: each request routed to it is retried once on a
live pod, however many arrive at once.

The client sets the destination header itself: it stands in for the EPP's pick of a pod that
died after it was picked (the EPP drops a dead pod within a scrape; a request routed in between
finds its listener closed). The EPP's own ext_proc and the header-stripping that guards against
a spoofed destination are taken out of the generated config for that; the clusters and routes
are as generated."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from epp_tools.stack.envoy import Envoy, free_port
from tests.conftest import COMPLETION

pytestmark = [pytest.mark.envoy]
EPP = str(Path(sys.executable).parent / "epp")
DESTINATION = "x-gateway-destination-endpoint"
CLIENTS = 8
PER_CLIENT = 24


def _config(pool: list[int], listen: int, admin: int) -> str:
    args = [EPP, "envoy-config", "--epp-address", "127.0.0.1:1", "--tls", "plaintext",
            "--listen", f"127.0.0.1:{listen}", "--admin", f"127.0.0.1:{admin}"]  # fmt: skip
    for port in pool:
        args += ["--pool-endpoint", f"127.0.0.1:{port}"]
    text = subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout
    doc: dict[str, Any] = yaml.safe_load(text)
    (listener,) = doc["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm.pop("early_header_mutation_extensions")
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"].endswith(".router")]
    clusters = doc["static_resources"]["clusters"]
    doc["static_resources"]["clusters"] = [c for c in clusters if c["name"] == "pool"]
    return str(yaml.safe_dump(doc))


async def test_every_request_routed_to_a_dead_pod_is_retried_on_a_live_one(sim_pods) -> None:
    # real time (no time_scale): each answer takes tens of ms, so the clients' requests overlap
    # and several routed to the dead pod need their retry at once
    fleet = await sim_pods(3, time_scale=1.0)
    dead = free_port()
    live = list(fleet.ports)
    listen, admin = free_port(), free_port()
    body = {**COMPLETION, "max_tokens": 6}

    async def client(session: aiohttp.ClientSession, c: int) -> list[tuple[bool, int, str]]:
        out = []
        for i in range(PER_CLIENT):
            to_dead = (c + i) % 4 == 0
            port = dead if to_dead else live[(c + i) % 3]
            headers = {DESTINATION: f"127.0.0.1:{port}"}
            async with session.post("/v1/completions", json=body, headers=headers) as r:
                out.append((to_dead, r.status, r.headers.get("x-sim-pod", "")))
                await r.read()
        return out

    with Envoy("", config_text=_config([*live, dead], listen, admin), listen_port=listen,
               admin_port=admin) as proxy:  # fmt: skip
        async with aiohttp.ClientSession(proxy.url) as session:
            results = await asyncio.gather(*(client(session, c) for c in range(CLIENTS)))
        stats = proxy.stats()
    answers = [a for r in results for a in r]
    to_dead = [a for a in answers if a[0]]
    assert len(to_dead) == CLIENTS * PER_CLIENT // 4
    assert [a for a in answers if a[1] != 200] == []
    assert {a[2] for a in to_dead} <= {"pod-0", "pod-1", "pod-2"}
    assert stats["cluster.pool.upstream_rq_retry_overflow"] == 0
    # every request routed to the dead pod was retried once, on a live pod
    assert stats["cluster.pool.upstream_rq_retry"] == len(to_dead)
    assert stats["cluster.pool.upstream_rq_retry_success"] == len(to_dead)
