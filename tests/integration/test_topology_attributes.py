"""Endpoint attributes through a real Envoy to simulated pods: GPU utilization from a DCGM
exporter feeding ``endpoint-attribute-filter`` / ``-scorer`` (with the exporter, and without one),
and topology from endpoint labels keeping the prefill pick on the decode pick's host."""

from __future__ import annotations

import contextlib
import logging
import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from epp.app import App
from epp.plugin import endpoint_attribute
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.topology import Topology, topology_key
from tests.conftest import (
    COMPLETION,
    ServerFactory,
    endpoints_yaml,
    make_settings,
    metrics_text,
    post,
    set_overrides,
    wait_for,
)

pytestmark = [pytest.mark.envoy]

# GPU-aware routing in the shape of upstream's sim-epp-gpu-config: drop GPUs above 90%, prefer
# idle GPUs (weight 2) over free KV cache (weight 1). The exporter port is the test server's.
GPU_CONFIG = """\
plugins:
- type: file-discovery
  parameters: {{path: {endpoints}}}
- type: dcgm-data-source
  name: dcgm-source
  parameters:
    port: {port}
    interval: 100ms
- type: dcgm-extractor
  name: dcgm-extractor
- type: endpoint-attribute-filter
  name: busy-gpu-filter
  parameters:
    attribute: GPUUtilization
    producer: dcgm-extractor
    onMissing: Pass
    fallbackOnEmpty: true
    algorithm:
      type: threshold
      threshold: {{operator: LessThanOrEqual, value: 0.9}}
- type: endpoint-attribute-scorer
  name: idle-gpu-scorer
  parameters:
    attributeKey: GPUUtilization
    producer: dcgm-extractor
    algorithm:
      type: linear_lower_is_better
      normalization:
        fixedRange: {{min: 0.0, max: 1.0}}
- type: kv-cache-utilization-scorer
- type: decode-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: busy-gpu-filter
  - pluginRef: idle-gpu-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: max-score-picker
dataLayer:
  discovery: {{pluginRef: file-discovery}}
  sources:
  - pluginRef: dcgm-source
    extractors:
    - pluginRef: dcgm-extractor
"""


def _dcgm_page(utilization: dict[str, int]) -> bytes:
    """An exporter page (DaemonSet style: a ``pod`` label per series) with two GPUs per pod."""
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for pod, util in utilization.items():
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",pod="{pod}",namespace="default"}} {util}')
        lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",pod="{pod}",namespace="default"}} 1')
    lines.append('DCGM_FI_DEV_FB_USED{gpu="0",pod="pod-0"} 4096')
    return ("\n".join(lines) + "\n").encode()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def start_epp(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await start_epp(ports, template, labels=..., **fields)`` → a ready App whose whole config
    is ``template`` (its own ``dataLayer``), alpha plugins allowed."""
    stack = contextlib.AsyncExitStack()

    async def start(
        ports: list[int],
        template: str,
        *,
        labels: dict[int, dict[str, str]] | None = None,
        **fields: Any,
    ) -> App:
        endpoints = tmp_path / f"endpoints-{len(stack._exit_callbacks)}.yaml"
        endpoints.write_text(endpoints_yaml(ports, labels=labels))
        body = template.format(endpoints=endpoints, **fields)
        config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n" + body
        app = App(make_settings(config, allow_experimental_plugins=True))
        await stack.enter_async_context(app)
        await app.wait_ready(60)
        return app

    yield start
    await stack.aclose()


def _gpu(app: App) -> dict[str, float | None]:
    return {e.name: endpoint_attribute(e, GPU_UTILIZATION) for e in app.store.snapshot()}


async def _served(url: str, n: int) -> list[str]:
    pods = []
    for i in range(n):
        body = {**COMPLETION, "prompt": f"gpu {i}"}
        status, headers, _ = await post(f"{url}/v1/completions", body)
        assert status == 200, headers
        pods.append(headers["x-sim-pod"])
    return pods


async def test_gpu_attributes_filter_and_score_endpoints(
    start_epp, sim_pods, envoy, metrics_server: ServerFactory
) -> None:
    exporter = await metrics_server(payload=_dcgm_page({"pod-0": 95, "pod-1": 20, "pod-2": 50}))
    fleet = await sim_pods(3)
    app = await start_epp(fleet.ports, GPU_CONFIG, port=exporter.port)
    await wait_for(lambda: _gpu(app) == {"pod-0": 0.95, "pod-1": 0.2, "pod-2": 0.5})
    proxy = envoy(app)
    # the scorer: the idlest GPU wins
    assert set(await _served(proxy.url, 6)) == {"pod-1"}

    # the filter: pod-0 has all its KV cache free, which outweighs a slightly busier GPU, but
    # it is above 90% and dropped
    for url, kv in zip(fleet.urls, (0.0, 1.0, 1.0), strict=True):
        await set_overrides(url, kv_cache_usage_perc=kv)
    exporter.payload = _dcgm_page({"pod-0": 91, "pod-1": 90, "pod-2": 90})
    await wait_for(
        lambda: (
            _gpu(app)["pod-0"] == 0.91
            and all(
                e.metrics is not None
                and e.metrics.kv_cache_usage_percent == (0.0 if e.name == "pod-0" else 1.0)
                for e in app.store.snapshot()
            )
        )
    )
    assert set(await _served(proxy.url, 6)) <= {"pod-1", "pod-2"}

    # every GPU above the threshold: fallbackOnEmpty keeps routing, scored as before
    exporter.payload = _dcgm_page({"pod-0": 99, "pod-1": 92, "pod-2": 96})
    # every pod's figure, not one: a pod still at 90% would pass the filter alone
    await wait_for(lambda: _gpu(app) == {"pod-0": 0.99, "pod-1": 0.92, "pod-2": 0.96})
    assert set(await _served(proxy.url, 3)) == {"pod-0"}


async def test_without_exporter_epp_routes_and_reports_poll_errors(
    start_epp, sim_pods, envoy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fleet = await sim_pods(3)
    app = await start_epp(fleet.ports, GPU_CONFIG, port=_closed_port())
    proxy = envoy(app)
    assert len(await _served(proxy.url, 6)) == 6
    assert _gpu(app) == {"pod-0": None, "pod-1": None, "pod-2": None}
    assert all(e.metrics is not None and e.metrics.update_time for e in app.store.snapshot())

    text = await metrics_text(app)
    found = re.search(
        r'llm_d_epp_datalayer_poll_errors_total\{source_type="dcgm-data-source"\} (\S+)', text
    )
    assert found is not None and float(found.group(1)) >= 3
    warnings = [r for r in caplog.records if r.getMessage() == "polling failed"]
    for pod in ("pod-0", "pod-1", "pod-2"):
        mine = [w for w in warnings if getattr(w, "endpoint", "") == f"default/{pod}"]
        assert len(mine) == 1, warnings  # rate-limited: once per endpoint in 30 s
        assert getattr(mine[0], "repeatsSuppressedFor", "") == "30s"


# Disaggregated P/D in the shape of upstream's pd-topology-epp-config, with the topology read
# from endpoint labels: the extractor sits under the model servers' metrics source.
PD_TOPOLOGY_CONFIG = """\
plugins:
- type: file-discovery
  parameters: {{path: {endpoints}}}
- type: metrics-data-source
- type: core-metrics-extractor
{declare_topology}- type: approx-prefix-cache-producer
  parameters: {{autoTune: false, blockSizeTokens: 64}}
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: topology-affinity-filter
  parameters: {{minAffinity: {level}}}
- type: topology-affinity-scorer
- type: disagg-profile-handler
  parameters:
    deciders: {{prefill: prefix-based-pd-decider}}
- type: prefix-based-pd-decider
  parameters: {{nonCachedTokens: 16}}
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: topology-affinity-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: topology-affinity-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
dataLayer:
  discovery: {{pluginRef: file-discovery}}
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
{topology_extractor}"""

HOST = "kubernetes.io/hostname"
RACK = "topology.kubernetes.io/rack"
ZONE = "topology.kubernetes.io/zone"
# pod-0 decodes on host h1; pod-2 prefills on that same host but is the busiest prefill pod.
POD_LABELS = {
    0: {"llm-d.ai/role": "decode", HOST: "h1", RACK: "r1", ZONE: "z1"},
    1: {"llm-d.ai/role": "prefill", HOST: "h2", RACK: "r1", ZONE: "z1"},
    2: {"llm-d.ai/role": "prefill", HOST: "h1", RACK: "r1", ZONE: "z1"},
    3: {"llm-d.ai/role": "prefill", HOST: "h3", RACK: "r2", ZONE: "z1"},
}
WITH_EXTRACTOR = "    - pluginRef: topology-extractor\n"


async def _prefillers(url: str, n: int) -> set[str]:
    """Send ``n`` distinct uncached long prompts; the prefill pods the decode pod was told of."""
    seen = set()
    for i in range(n):
        prompt = "".join(f"{i:03d}{j:05d}" for j in range(512))  # 4096 B, no shared prefix
        status, headers, _ = await post(f"{url}/v1/completions", {**COMPLETION, "prompt": prompt})
        assert status == 200, headers
        assert headers["x-sim-pod"] == "pod-0"
        seen.add(headers["x-sim-saw-prefiller"])
    return seen


async def _start_pd(
    start_epp, sim_pods, level: str, topology_extractor: str, *, declared: bool = True
) -> tuple[App, Any]:
    fleet = await sim_pods(4)
    await set_overrides(fleet.urls[2], num_requests_waiting=6)
    app = await start_epp(
        fleet.ports,
        PD_TOPOLOGY_CONFIG,
        labels=POD_LABELS,
        level=level,
        topology_extractor=topology_extractor,
        # The control declares no extractor at all: one declared but listed under no source is
        # attached to endpoint events on its own, as upstream does.
        declare_topology="- type: topology-extractor\n" if declared else "",
    )
    await wait_for(
        lambda: all(
            e.metrics is not None
            and e.metrics.waiting_queue_size == (6 if e.name == "pod-2" else 0)
            for e in app.store.snapshot()
        )
    )
    return app, fleet


@pytest.mark.parametrize(
    "listed",
    [
        pytest.param(WITH_EXTRACTOR, id="listed-under-metrics-source"),
        pytest.param("", id="declared-only-as-upstream"),
    ],
)
async def test_topology_from_labels_keeps_prefill_on_the_decode_host(
    start_epp, sim_pods, envoy, listed: str
) -> None:
    app, fleet = await _start_pd(start_epp, sim_pods, "host", listed)
    key = topology_key()
    topologies = {e.name: endpoint_attribute(e, key) for e in app.store.snapshot()}
    assert topologies["pod-2"] == Topology(hostname="h1", rack="r1", zone="z1")
    assert topologies["pod-3"] == Topology(hostname="h3", rack="r2", zone="z1")
    proxy = envoy(app)
    # pod-2 is the busiest prefill pod but the only one on the decode pod's host
    assert await _prefillers(proxy.url, 4) == {f"127.0.0.1:{fleet.ports[2]}"}


async def test_without_topology_the_filter_fails_open(start_epp, sim_pods, envoy) -> None:
    app, fleet = await _start_pd(start_epp, sim_pods, "host", "", declared=False)
    assert all(endpoint_attribute(e, topology_key()) is None for e in app.store.snapshot())
    proxy = envoy(app)
    idle = {f"127.0.0.1:{fleet.ports[i]}" for i in (1, 3)}
    assert await _prefillers(proxy.url, 4) <= idle
