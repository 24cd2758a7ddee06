"""The load generator against real simulated pods (in-process fleet, loopback only)."""

from __future__ import annotations

import math

from epp_tools.bench.runner.driver import probe, run
from epp_tools.bench.workloads.agentic import AgenticShape, build_agentic
from epp_tools.bench.workloads.oracle import compute_oracle
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec
from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

SHAPE = AgenticShape(
    sessions=2, turns=3, system_tokens=60, context_median=300, context_sigma=0.1,
    context_max=600, tool_median=40, tool_sigma=0.3, tool_max=200, output_median=12,
    output_sigma=0.2, output_max=30,
)  # fmt: skip


async def test_driver_times_tokens_and_reads_usage_when_a_pod_answers() -> None:
    workload = build_agentic(SHAPE, seed=4, fleet=FleetSpec(), concurrency=1)
    oracle = compute_oracle(workload.requests, 16)
    async with SimFleet([PodConfig(name="pod-0", time_scale=50.0)]) as fleet:
        outcomes = await run(fleet.urls[0], workload.requests, concurrency=1, time_scale=50.0)
    assert [o.status for o in outcomes] == [200] * len(workload.requests)
    assert [o.tokens for o in outcomes] == [r.max_tokens for r in workload.requests]
    assert all(o.pod == "pod-0" for o in outcomes)
    assert all(0 < o.ttft <= o.latency for o in outcomes)
    assert all(not math.isnan(o.itl) for o in outcomes)
    # one pod, one request at a time, room for everything: the pod reaches the oracle exactly
    assert [(o.prompt_tokens, o.cached_tokens) for o in outcomes] == list(oracle.per_request)


async def test_driver_waits_for_arrival_times_when_requests_are_open_loop() -> None:
    requests = [
        BenchRequest(f"r{i}", 0, MODEL, ({"role": "user", "content": f"q{i} "},), 2, at=0.2 * i)
        for i in range(3)
    ]
    async with SimFleet([PodConfig(name="pod-0", time_scale=50.0)]) as fleet:
        outcomes = await run(fleet.urls[0], requests, concurrency=8, time_scale=2.0)
    assert [o.status for o in outcomes] == [200, 200, 200]
    assert outcomes[1].sent >= 0.1 - 0.01 and outcomes[2].sent >= 0.2 - 0.01


async def test_driver_records_unfinished_requests_when_the_deadline_passes() -> None:
    requests = [BenchRequest("late", 0, MODEL, ({"role": "user", "content": "late "},), 2, at=30.0)]
    async with SimFleet([PodConfig(name="pod-0")]) as fleet:
        outcomes = await run(fleet.urls[0], requests, concurrency=1, deadline=0.2)
    assert outcomes[0].status == 0
    assert outcomes[0].error == "not finished by the deadline"


async def test_probe_measures_fresh_and_reused_connections_when_asked() -> None:
    async with SimFleet([PodConfig(name="pod-0", time_scale=50.0)]) as fleet:
        result = await probe(fleet.urls[0], n=3)
    assert len(result["fresh"]) == 3 and len(result["reused"]) == 3
    assert all(t > 0 for t in result["fresh"] + result["reused"])
