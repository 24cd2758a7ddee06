"""Routing across clusters through real Envoys: two simulated pools, each behind its own EPP and
Envoy gateway, and a cluster-scoped EPP in front whose endpoints are the two gateways, configured
as upstream's multicluster example (``multicluster-file-discovery``, the metrics source and
extractor reading each cluster's EPP metrics port, the session-affinity filter and the
kv-cache and queue scorers), with the multicluster prefix producer and scorer beside them.

A request goes client → front Envoy → the gateway the front EPP picked → that cluster's EPP picks
a pod. With both clusters idle, a prompt sent again goes back to the cluster that served it. Load
moves from one cluster to the other (the simulated pods report waiting requests and
KV use, their EPP averages them into ``llm_d_epp_average_*``, the front EPP scrapes that): new
requests follow to the cluster with room, while a session that carries its cluster's token stays
on its cluster. Which cluster served is read from the pods' own counters (``/sim/stats``) and from
the session token, which names the cluster endpoint."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from epp.app import App
from epp.plugin import MULTICLUSTER_KV_CACHE_UTILIZATION, MULTICLUSTER_QUEUE_SIZE
from tests.conftest import COMPLETION, make_settings, post, set_overrides, wait_for

pytestmark = [pytest.mark.envoy]

FRONT = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: multicluster-file-discovery
    name: discovery
    parameters:
      path: {clusters}
      watchFile: true
      pollInterval: 100ms
  - type: multicluster-metrics-data-source
    name: metrics-source
    parameters:
      scheme: http
  - type: multicluster-metrics-extractor
    name: metrics-extractor
  - type: multicluster-session-affinity-filter
    name: session-affinity
  - type: multicluster-approx-prefix-cache-producer
    parameters: {{autoTune: false, blockSizeTokens: 16}}
  - type: multicluster-prefix-cache-scorer
    name: prefix
    parameters: {{prefixMatchInfoProducerName: multicluster-approx-prefix-cache-producer}}
  - type: multicluster-kv-cache-utilization-scorer
    name: kv-cache
  - type: multicluster-queue-scorer
    name: queue
  - type: max-score-picker
  - type: single-profile-handler
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: session-affinity
      - pluginRef: prefix
      - pluginRef: kv-cache
      - pluginRef: queue
      - pluginRef: max-score-picker
dataLayer:
  discovery:
    pluginRef: discovery
  sources:
    - pluginRef: metrics-source
      extractors:
        - pluginRef: metrics-extractor
"""


def clusters_file(path: Path, gateways: dict[str, tuple[Any, Any]]) -> Path:
    lines = ["endpoints:"]
    for name, (gateway, epp) in gateways.items():
        lines += [
            f"- name: {name}",
            "  address: 127.0.0.1",
            f"  port: '{gateway.listen_port}'",
            "  labels:",
            "    metricsAddress: 127.0.0.1",
            f"    metricsPort: '{epp.metrics_port}'",
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


async def served(fleet: Any) -> int:
    """Requests the pods of one cluster have served so far."""
    total = 0
    async with aiohttp.ClientSession() as session:
        for url in fleet.urls:
            async with session.get(f"{url}/sim/stats") as r:
                total += (await r.json())["requests_served"]
    return total


async def load(fleet: Any, waiting: int, kv: float) -> None:
    for url in fleet.urls:
        await set_overrides(url, num_requests_waiting=waiting, kv_cache_usage_perc=kv)


def aggregates(front: App) -> dict[str, tuple[float | None, float | None]]:
    """Each cluster's (queue, KV use) as the front EPP sees them."""
    out = {}
    for endpoint in front.store.snapshot():
        attrs = endpoint.metrics.attributes if endpoint.metrics else {}
        queue = attrs.get(MULTICLUSTER_QUEUE_SIZE)
        out[endpoint.name] = (queue, attrs.get(MULTICLUSTER_KV_CACHE_UTILIZATION))
    return out


async def send(
    url: str, n: int, headers: dict[str, str] | None = None, body: dict[str, Any] = COMPLETION
) -> list[str]:
    """The clusters that served ``n`` requests, as their session tokens name them."""
    clusters = []
    for _ in range(n):
        status, response, answer = await post(url, body, headers=headers)
        assert status == 200, answer[:300]
        clusters.append(base64.b64decode(response["x-session-token"]).decode())
    return clusters


async def test_requests_follow_the_cluster_with_room_and_sessions_stay(
    tmp_path: Path, start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleets = {"cluster-a": await sim_pods(2), "cluster-b": await sim_pods(2)}
    epps = {
        name: await start_app(fleet.ports, refresh_prometheus_metrics_interval=0.1)
        for name, fleet in fleets.items()
    }
    gateways = {name: (envoy(epp), epp) for name, epp in epps.items()}
    clusters = clusters_file(tmp_path / "clusters.yaml", gateways)
    settings = make_settings(
        textwrap.dedent(FRONT.format(clusters=clusters)), allow_experimental_plugins=True
    )
    async with App(settings) as front:
        await front.wait_ready(60)
        proxy = envoy(front)
        url = f"{proxy.url}/v1/completions"

        await wait_for(lambda: aggregates(front) == {"cluster-a": (0, 0), "cluster-b": (0, 0)})
        for prompt in ("alpha", "beta"):  # equal load: the cached prefix decides
            long = {**COMPLETION, "prompt": " ".join(f"{prompt}-{i}" for i in range(400))}
            first = await send(url, 1, body=long)
            assert await send(url, 4, body=long) == first * 4

        await load(fleets["cluster-b"], waiting=6, kv=0.6)
        await wait_for(lambda: aggregates(front) == {"cluster-a": (0, 0), "cluster-b": (6, 0.6)})
        before = {name: await served(fleet) for name, fleet in fleets.items()}
        assert await send(url, 8) == ["default/cluster-a"] * 8
        assert await served(fleets["cluster-a"]) - before["cluster-a"] == 8
        assert await served(fleets["cluster-b"]) == before["cluster-b"]
        session = (await post(url, COMPLETION))[1]["x-session-token"]

        # The load moves to cluster A: new requests follow, the session stays on its cluster.
        await load(fleets["cluster-a"], waiting=6, kv=0.6)
        await load(fleets["cluster-b"], waiting=0, kv=0.0)
        await wait_for(lambda: aggregates(front) == {"cluster-a": (6, 0.6), "cluster-b": (0, 0)})
        assert await send(url, 6) == ["default/cluster-b"] * 6
        pinned = await send(url, 4, headers={"x-session-token": session})
        assert pinned == ["default/cluster-a"] * 4
