"""Workload (d): classes, tenants, arrival rate and the capacity model."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

import pytest

from epp.k8s.files import parse_objects
from epp_tools.bench.workloads.catalog import build
from epp_tools.bench.workloads.overload import CLASSES, DURATION_S, FLEET, LEAD_IN_S, request_cost
from epp_tools.bench.workloads.spec import (
    FAIRNESS_HEADER,
    OBJECTIVE_HEADER,
    BenchRequest,
    FleetSpec,
)
from epp_tools.sim.tokenizer import render_chat

WINDOW = LEAD_IN_S + DURATION_S["default"]


@pytest.mark.parametrize(
    ("fleet", "output", "uncached", "expected"),
    [
        pytest.param(FLEET, 80, 100, 80 * 0.02064 / 8 + 100 / 4000, id="overload-fleet"),
        pytest.param(FLEET, 1, 0, 0.02064 / 8, id="one-token-no-prefill"),
        pytest.param(FleetSpec(), 10, 1600, 10 * 0.02648 / 256 + 0.1, id="default-fleet"),
    ],
)
def test_request_cost_is_its_share_of_full_steps_plus_prefill_when_computed(
    fleet: FleetSpec, output: int, uncached: int, expected: float
) -> None:
    assert request_cost(fleet, output, uncached) == pytest.approx(expected)


def offered_pod_seconds(r: BenchRequest) -> float:
    """What one generated request costs FLEET, worked out from its messages with the simulator's
    own template (independently of the workload's cost model): its share of ``max_tokens`` full
    decode steps (batch of 8 at 20 + 0.08 * 8 ms) plus its uncached prefill at 4000 tokens/s;
    the full 16-token blocks of a shared system prompt are cached."""
    prompt = len(render_chat(list(r.messages)))
    system = [m for m in r.messages if m["role"] == "system"]
    cached = len(render_chat(system, add_generation_prompt=False)) // 16 * 16 if system else 0
    return r.max_tokens * (20.0 + 0.08 * 8) / 1000 / 8 + (prompt - cached) / 4000


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (1, 2, 3)])
def test_overload_offers_twice_the_capacity_when_built(seed: int) -> None:
    workload = build("d", seed=seed)
    offered = sum(offered_pod_seconds(r) for r in workload.requests) / WINDOW / 4
    assert offered == pytest.approx(2.0, abs=0.1)
    assert workload.shape["overload_factor"] == pytest.approx(offered, rel=0.02)


def test_overload_class_loads_are_the_documented_shares_when_built() -> None:
    load: Counter[str] = Counter()
    for r in build("d").requests:
        load[r.objective] += offered_pod_seconds(r) / WINDOW / 4
    assert set(load) == {"latency-sensitive", "agentic", "batch"}
    # the module doc: 0.2 latency-sensitive, 0.9 agentic, 0.9 batch (of the fleet's capacity)
    assert load["latency-sensitive"] == pytest.approx(0.2, abs=0.03)
    assert load["agentic"] == pytest.approx(0.9, abs=0.1)
    assert load["batch"] == pytest.approx(0.9, abs=0.1)


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (1, 2, 3)])
def test_tenant_a_sends_exactly_ten_times_tenant_b_when_built(seed: int) -> None:
    requests = build("d", seed=seed).requests
    tenants = Counter(r.fairness_id for r in requests if r.objective == "agentic")
    assert tenants["tenant-a"] == 10 * tenants["tenant-b"] > 0
    assert {r.fairness_id for r in requests if r.objective != "agentic"} == {""}


def _gap_cv(times: list[float]) -> float:
    gaps = [b - a for a, b in itertools.pairwise(sorted(times))]
    return statistics.pstdev(gaps) / statistics.fmean(gaps)


def test_agentic_arrivals_are_burstier_than_poisson_when_built() -> None:
    requests = build("d", seed=5).requests
    by_class = {
        c.objective: [r.at for r in requests if r.objective == c.objective] for c in CLASSES
    }
    assert 0.75 <= _gap_cv(by_class["latency-sensitive"]) <= 1.25  # Poisson: CV 1
    assert _gap_cv(by_class["agentic"]) >= 1.5
    arrivals = [r.at for r in requests]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] >= 0.0 and arrivals[-1] < WINDOW + 2.0


def test_overload_requests_carry_objective_and_fairness_headers_when_built() -> None:
    workload = build("d")
    for r in workload.requests:
        headers = r.headers()
        assert headers[OBJECTIVE_HEADER] == r.objective
        assert headers.get(FAIRNESS_HEADER, "") == r.fairness_id
    assert workload.reference_objective == "latency-sensitive"
    assert workload.measure_from == LEAD_IN_S


def test_overload_objectives_file_declares_the_class_priorities_when_rendered() -> None:
    workload = build("d")
    declared = parse_objects(workload.objectives_yaml().encode())
    assert {o.name: o.priority for o in declared.objectives} == {
        "latency-sensitive": 10,
        "agentic": 0,
        "batch": -1,
    }


def test_overload_warms_every_shared_prompt_when_built() -> None:
    workload = build("d")
    shared = {r.messages[0]["content"] for r in workload.requests if len(r.messages) == 2}
    warmed = {messages[0]["content"] for messages in workload.warm_prefixes}
    assert shared == warmed
    assert len(warmed) == 4 * 2 + 2  # 4 agent prompts per tenant, 2 batch instructions
