"""The utilization detector's ``stalenessPolicy`` through a real Envoy: one pod's ``/metrics``
stalls (the simulator's ``stall_metrics`` fault) while its last scrape made it the best pick."""

from __future__ import annotations

import time

import aiohttp
import pytest

from tests.conftest import COMPLETION, post, set_overrides, settle, wait_for

pytestmark = [pytest.mark.envoy]

CONFIG = """\
plugins:
- type: queue-scorer
- type: utilization-detector
  parameters:
    stalenessPolicy: {policy}
    # not the default 200ms: on a loaded machine the healthy pod's scrapes can fall that far
    # apart, and with every pod stale "exclude" keeps them all (a CI run saw it)
    metricsStalenessThreshold: 1s
saturationDetector: {{pluginRef: utilization-detector}}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


@pytest.mark.parametrize(
    ("policy", "expected_pod"),
    [
        pytest.param("exclude", "pod-0", id="exclude-routes-around-the-stalled-pod"),
        pytest.param("ignore", "pod-1", id="ignore-routes-on-last-values"),
        pytest.param("saturated", "pod-1", id="saturated-routes-on-last-values"),
    ],
)
async def test_stalled_metrics_pod_is_routed_per_staleness_policy(
    start_app, sim_pods, envoy, policy: str, expected_pod: str
) -> None:
    fleet = await sim_pods(2)
    await set_overrides(fleet.urls[0], num_requests_waiting=3, kv_cache_usage_perc=0.1)
    await set_overrides(fleet.urls[1], num_requests_waiting=0, kv_cache_usage_perc=0.1)
    app = await start_app(fleet.ports, CONFIG.format(policy=policy))
    await settle(app, lambda m: all(x is not None for x in m.values()))
    proxy = envoy(app)
    status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
    assert (status, headers["x-sim-pod"]) == (200, "pod-1")

    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[1]}/sim/faults", json={"stall_metrics": True}) as r:
            assert r.status == 200

        def pod1_stale() -> bool:
            ep = {e.port: e for e in app.store.snapshot()}[fleet.ports[1]]
            return ep.metrics is not None and time.monotonic() - ep.metrics.update_time > 1.2

        await wait_for(pod1_stale, 5)
        picked = []
        for _ in range(6):
            status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
            assert status == 200
            picked.append(headers["x-sim-pod"])
        assert picked == [expected_pod] * 6
        async with s.post(f"{fleet.urls[1]}/sim/faults", json={}) as r:
            assert r.status == 200
