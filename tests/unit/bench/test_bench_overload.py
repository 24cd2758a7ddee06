"""Workload (d): classes, tenants, arrival rate and the capacity model."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

import pytest

from epp.bench.overload import (
    CLASSES,
    DURATION_S,
    FLEET,
    LEAD_IN_S,
    class_rate,
    fleet_capacity,
    overload_factor,
    request_cost,
)
from epp.bench.spec import FAIRNESS_HEADER, OBJECTIVE_HEADER, FleetSpec
from epp.bench.workloads import build
from epp.k8s.files import parse_objects

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


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (1, 2, 3)])
def test_overload_offers_twice_the_capacity_when_built(seed: int) -> None:
    workload = build("d", seed=seed)
    assert overload_factor(workload.requests, workload.fleet, WINDOW) == pytest.approx(2.0, abs=0.1)
    assert workload.shape["overload_factor"] == pytest.approx(2.0, abs=0.1)
    offered = len(workload.requests) / WINDOW
    assert offered == pytest.approx(2.0 * fleet_capacity(FLEET), rel=0.1)


def test_overload_class_counts_follow_their_rates_when_built() -> None:
    counts = Counter(r.objective for r in build("d").requests)
    for c in CLASSES:
        expected = round(class_rate(c, FLEET) * WINDOW)
        assert counts[c.objective] == pytest.approx(expected, abs=len(c.tenants) * 6)
    assert set(counts) == {"latency-sensitive", "agentic", "batch"}


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
