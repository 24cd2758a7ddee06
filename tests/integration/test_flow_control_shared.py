"""Flow control across two active-active replicas sharing a real ``redis-server``: the queue
occupancy one replica reports reaches the other, and ``--flow-control-pool-wide-max-requests``
makes a band's ``maxRequests`` a bound on the requests queued across the pool."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import COMPLETION, post, wait_for
from tests.integration.test_flow_control import outcomes

pytestmark = [pytest.mark.envoy]

SLOW = {**COMPLETION, "max_tokens": 200}


def flow_config(url: str) -> str:
    """Each replica admits one request at a time and queues one more (per replica by default)."""
    return f"""\
    featureGates: [flowControl]
    plugins:
    - type: redis-syncer
      parameters: {{url: '{url}', timeout: 250ms}}
    - type: queue-scorer
    - type: concurrency-detector
      parameters: {{maxConcurrency: 1}}
    dataLayer:
      crossReplicaSyncerPluginRef: redis-syncer
      crossReplicaSyncInterval: 50ms
    flowControl:
      defaultRequestTTL: 30s
      saturationDetector: {{pluginRef: concurrency-detector}}
      priorityBands:
      - {{priority: 0, maxRequests: 1}}
    """


def gauge(app: Any, name: str) -> float:
    for metric in app.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == name:
                return float(sample.value)
    return 0.0


@pytest.mark.parametrize("pool_wide", [False, True])
async def test_a_band_full_at_a_peer_rejects_here_only_when_pool_wide(
    start_app, sim_pods, envoy, redis_server, pool_wide: bool
) -> None:
    fleet = await sim_pods(1, time_scale=1.0, decode_base_ms=5.0)
    url = redis_server().url
    options = {"flow_control_pool_wide_max_requests": pool_wide}
    a, b = [await start_app(fleet.ports, flow_config(url), seed=i, **options) for i in range(2)]
    url_a, url_b = (f"{envoy(app).url}/v1/completions" for app in (a, b))
    first = asyncio.create_task(post(url_a, SLOW))  # holds replica a's only slot
    await wait_for(lambda: outcomes(a, "Dispatched") == 1, 5)
    queued = asyncio.create_task(post(url_a, COMPLETION))  # waits in a's band (now full)
    # b hears of it within a few sync rounds, whatever the flag
    await wait_for(lambda: gauge(b, "llm_d_epp_flow_control_cross_replica_peers") == 1, 5)
    await wait_for(lambda: gauge(b, "llm_d_epp_flow_control_cross_replica_queue_size") == 1, 5)
    status, headers, _ = await post(url_b, COMPLETION)
    if pool_wide:  # the pool's one queue slot is taken at a
        assert status == 429
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert outcomes(b, "RejectedCapacity") == 1
    else:  # b's own band is empty: admitted and served
        assert status == 200
        assert outcomes(b, "RejectedCapacity") == 0
    assert (await first)[0] == 200 and (await queued)[0] == 200
