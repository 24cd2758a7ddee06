"""Flow control through a real Envoy: queueing, 429/503 outcomes with drop reasons, client
disconnects while queued, sheddable traffic and the probabilistic admitter."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.conftest import COMPLETION, post, wait_for

pytestmark = [pytest.mark.envoy]

# One pod that admits one request at a time (concurrency-detector: 1 in flight = saturated).
FLOW = """\
    featureGates: [flowControl]
    plugins:
    - type: queue-scorer
    - type: concurrency-detector
      parameters: {{maxConcurrency: 1}}
    flowControl:
      defaultRequestTTL: {ttl}
      noEndpointRequestTTL: 300ms
      saturationDetector: {{pluginRef: concurrency-detector}}
      priorityBands:
      - {{priority: 0, maxRequests: 1}}
    """
SLOW = {**COMPLETION, "max_tokens": 200}  # about a second on the simulator used below


def outcomes(app, outcome: str) -> float:
    total = 0.0
    for metric in app.metrics.registry.collect():
        if metric.name == "llm_d_epp_flow_control_requests":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("outcome") == outcome:
                    total += sample.value
    return total


async def test_queue_full_gets_429_and_ttl_expiry_gets_429(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1, time_scale=1.0, decode_base_ms=5.0)
    app = await start_app(fleet.ports, FLOW.format(ttl="400ms"))
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    first = asyncio.create_task(post(url, SLOW))  # dispatched, holds the only slot
    await wait_for(lambda: outcomes(app, "Dispatched") == 1, 5)
    second = asyncio.create_task(post(url, COMPLETION))  # queued (band holds 1)
    await wait_for(lambda: app.flow.queued() == 1, 5)
    status, headers, body = await post(url, COMPLETION)  # band full
    assert status == 429
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert body.startswith(b"inference error: ResourceExhausted")
    status, headers, _ = await second  # waited past its TTL while the first ran
    assert status == 429
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
    assert (await first)[0] == 200
    assert outcomes(app, "RejectedCapacity") == 1 and outcomes(app, "EvictedTTL") == 1


async def test_no_endpoints_gets_503_after_the_no_endpoint_ttl(start_app, envoy) -> None:
    app = await start_app([], FLOW.format(ttl="5s"))
    proxy = envoy(app)
    t0 = time.monotonic()
    status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
    assert status == 503
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert time.monotonic() - t0 < 4


async def test_client_disconnect_while_queued_frees_the_slot(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1, time_scale=1.0, decode_base_ms=5.0)
    app = await start_app(fleet.ports, FLOW.format(ttl="30s"))
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    # holds the slot for about 3 s, so a slow machine cannot dispatch the queued request first
    first = asyncio.create_task(post(url, {**SLOW, "max_tokens": 600}))
    await wait_for(lambda: outcomes(app, "Dispatched") == 1, 5)
    queued = asyncio.create_task(post(url, COMPLETION))
    await wait_for(lambda: app.flow.queued() == 1, 5)
    # The client goes away while its request waits in the EPP. Envoy half-closes the ext_proc
    # stream (graceful close) and would reset it a second later; the half-close alone frees the
    # slot (unit tests: test_extproc, test_h2).
    queued.cancel()
    await wait_for(lambda: outcomes(app, "EvictedContextCancelled") == 1, 5)
    # the band's only queue slot is free again: the next request queues instead of a 429
    status, _, _ = await post(url, COMPLETION)
    assert status == 200
    assert (await first)[0] == 200


async def test_sheddable_requests_are_rejected_by_the_probabilistic_admitter(
    start_app, sim_pods, envoy, tmp_path
) -> None:
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
        "metadata: {name: batch}\nspec: {priority: -1}\n---\n"
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
        "metadata: {name: chat}\nspec: {priority: 10}\n"
    )
    fleet = await sim_pods(2)
    for url in fleet.urls:  # saturation 0.4: below legacy shedding, p = min(0.4^5 x 300, 1) = 1
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{url}/sim/overrides", json={"num_requests_waiting": 2}) as r,
        ):
            assert r.status == 200
    app = await start_app(
        fleet.ports,
        """\
        plugins:
        - type: queue-scorer
        - type: probabilistic-admitter
        """,
        objectives_files=(str(objectives),),
    )
    await wait_for(
        lambda: all(e.metrics and e.metrics.waiting_queue_size == 2 for e in app.store.snapshot()),
        5,
    )
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    status, headers, body = await post(url, COMPLETION, {"x-llm-d-inference-objective": "batch"})
    assert status == 429, body
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    status, _, _ = await post(url, COMPLETION, {"x-llm-d-inference-objective": "chat"})
    assert status == 200
