"""In-flight eviction (``flowControl.enableEviction``) through a real Envoy: the evicted client
gets upstream's 429 with reason ``evicted``, and its flow-control slot goes to the request that
caused the eviction."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import COMPLETION, post, wait_for

pytestmark = [pytest.mark.envoy]

# One pod that admits one request at a time; sheddable requests may be evicted for others.
FLOW = """\
    featureGates: [flowControl]
    plugins:
    - type: queue-scorer
    - type: concurrency-detector
      parameters: {maxConcurrency: 1}
    flowControl:
      enableEviction: true
      saturationDetector: {pluginRef: concurrency-detector}
    """
OBJECTIVES = textwrap.dedent("""\
    apiVersion: llm-d.ai/v1alpha2
    kind: InferenceObjective
    metadata: {name: batch}
    spec: {priority: -1}
    """)
BATCH = {"x-llm-d-inference-objective": "batch"}


def metric(app: Any, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that carry ``labels``."""
    return sum(
        float(sample.value)
        for family in app.metrics.registry.collect()
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


# The same with upstream's eviction policies declared (they are the defaults; alpha)
DECLARED = FLOW.replace(
    "    plugins:\n",
    "    plugins:\n"
    "    - type: sheddable-eviction-filter\n"
    "    - type: priority-then-time-eviction-order-policy\n",
)


@pytest.mark.parametrize(
    "config", [pytest.param(FLOW, id="default-policies"), pytest.param(DECLARED, id="declared")]
)
async def test_evicted_request_gets_its_429_and_frees_its_slot_when_a_higher_band_waits(
    start_app: Any, sim_pods: Any, envoy: Any, tmp_path: Path, config: str
) -> None:
    fleet = await sim_pods(1)
    # The pod answers nothing for 3 s: the sheddable request is in flight, no response yet.
    faults = {"slow_ms": 3000}
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{fleet.urls[0]}/sim/faults", json=faults) as r,
    ):
        assert r.status == 200
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    app = await start_app(
        fleet.ports,
        config,
        objectives_files=(str(objectives),),
        allow_experimental_plugins=config is DECLARED,
    )
    assert {"sheddable-eviction-filter", "priority-then-time-eviction-order-policy"} <= {
        p.typed_name.type for p in app.pipeline.instances.values()
    }
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    dispatched = {"outcome": "Dispatched"}
    victim = asyncio.create_task(post(url, COMPLETION, BATCH))
    await wait_for(lambda: metric(app, "llm_d_epp_flow_control_requests_total", **dispatched) == 1)
    urgent = asyncio.create_task(post(url, COMPLETION))  # priority 0: queued, saturated pool

    status, headers, body = await asyncio.wait_for(victim, 2.5)  # well before the pod answers
    assert status == 429
    assert headers["x-llm-d-request-dropped-reason"] == "evicted"
    assert body == b"request evicted by flow control"

    status, _, _ = await urgent  # took the freed slot
    assert status == 200
    assert metric(app, "llm_d_epp_flow_control_revocations_total", outcome="confirmed") == 1
    assert metric(app, "llm_d_epp_flow_control_requests_total", **dispatched) == 2
