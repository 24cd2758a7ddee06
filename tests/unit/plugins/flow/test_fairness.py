from __future__ import annotations

from typing import Any

import pytest

from epp.flowcontrol.queues import Band, BandConfig
from epp.plugin.flow import FairnessPolicy, QueuedRequest
from epp.plugin.params import ParamError, decode
from epp.plugins.flow.program_aware import ProgramAwareFairness, jain_index
from tests.builders import handle
from tests.unit.flowcontrol.flow_builders import build_plugin, request


def _band(fairness: FairnessPolicy, ordering: str = "fcfs-ordering-policy") -> Band:
    config = BandConfig(5000, 10**9, fairness, build_plugin(handle(), ordering))
    return Band(0, config)


def _push(band: Band, flow: str, seq: int, enqueued: float) -> QueuedRequest:
    item = QueuedRequest(request(f"{flow}-{seq}"), list, flow, 0, enqueued, 0.0, 10, seq)
    band.push(item)
    return item


def _dispatch(band: Band, policy: FairnessPolicy, now: float = 100.0) -> str:
    """Run one selection and commit it, as the controller does; returns the request id."""
    flow = policy.select_flow(band, now)
    assert flow is not None
    item = band.pop(band.flows[flow.flow_id], now)
    policy.on_dispatch(band, flow, item, now)
    return item.request.request_id


def test_global_strict_picks_best_head_across_flows_when_fcfs() -> None:
    policy = build_plugin(handle(), "global-strict-fairness-policy")
    band = _band(policy)
    _push(band, "a", 0, 5.0)
    _push(band, "b", 1, 1.0)
    _push(band, "a", 2, 2.0)
    _push(band, "c", 3, 1.0)
    order = [_dispatch(band, policy) for _ in range(4)]
    assert order == ["b-1", "c-3", "a-2", "a-0"]


def test_global_strict_returns_none_when_band_empty() -> None:
    policy = build_plugin(handle(), "global-strict-fairness-policy")
    assert policy.select_flow(_band(policy), 0.0) is None


def test_round_robin_rotates_sorted_flows_when_all_busy() -> None:
    policy = build_plugin(handle(), "round-robin-fairness-policy")
    band = _band(policy)
    for seq, flow in enumerate(["c", "a", "b", "a", "c", "a"]):
        _push(band, flow, seq, float(seq))
    order = [_dispatch(band, policy) for _ in range(6)]
    assert order == ["a-1", "b-2", "c-0", "a-3", "c-4", "a-5"]


def test_round_robin_does_not_advance_when_selection_not_committed() -> None:
    policy = build_plugin(handle(), "round-robin-fairness-policy")
    band = _band(policy)
    _push(band, "a", 0, 0.0)
    _push(band, "b", 1, 0.0)
    first = policy.select_flow(band, 0.0)
    again = policy.select_flow(band, 0.0)
    assert first is not None and again is not None
    assert first.flow_id == again.flow_id == "a"


def test_round_robin_continues_after_vanished_flow_when_cursor_flow_drained() -> None:
    policy = build_plugin(handle(), "round-robin-fairness-policy")
    band = _band(policy)
    _push(band, "a", 0, 0.0)
    _push(band, "b", 1, 0.0)
    _push(band, "c", 2, 0.0)
    assert _dispatch(band, policy) == "a-0"  # flow a is now gone
    assert _dispatch(band, policy) == "b-1"
    _push(band, "a", 3, 1.0)
    assert _dispatch(band, policy) == "c-2"
    assert _dispatch(band, policy) == "a-3"


# ---- program-aware (LAS) -------------------------------------------------------------------


def _las(**params: Any) -> ProgramAwareFairness:
    policy: ProgramAwareFairness = build_plugin(handle(), "program-aware-fairness", **params)
    return policy


@pytest.mark.parametrize(
    ("services", "heads", "expected"),
    [
        pytest.param({"a": 100.0, "b": 0.0}, {"a": 90.0, "b": 99.0}, "b", id="least-service-wins"),
        pytest.param(
            {"a": 100.0, "b": 100.0}, {"a": 90.0, "b": 99.0}, "a", id="equal-service-oldest-head"
        ),
        pytest.param(
            # a: 0.8*(1-0) + 0.2*1 = 1.0 ; b: 0.8*(1-1) + 0.2*0 = 0 -> a
            {"a": 0.0, "b": 50.0},
            {"a": 90.0, "b": 99.0},
            "a",
            id="both-signals-agree",
        ),
        pytest.param(
            # a: 0.8*(1 - 10/100) + 0.2*0 = 0.72 ; b: 0.8*0 + 0.2*1 = 0.2 ; c: 0.8*1 + 0.2*0.5
            {"a": 10.0, "b": 100.0, "c": 0.0},
            {"a": 99.0, "b": 90.0, "c": 94.5},
            "c",
            id="three-programs",
        ),
    ],
)
def test_las_picks_highest_score_when_programs_compete(
    services: dict[str, float], heads: dict[str, float], expected: str
) -> None:
    policy = _las(lasHalfLifeSeconds=0)
    now = 100.0
    for program, cost in services.items():
        policy.on_complete(program, int(cost), 0, now)
    band = _band(policy)
    for seq, (program, enqueued) in enumerate(heads.items()):
        _push(band, program, seq, enqueued)
    flow = policy.select_flow(band, now)
    assert flow is not None and flow.flow_id == expected


def test_las_score_weights_wait_when_service_weight_zero() -> None:
    policy = _las(lasWeightService=0.0, lasWeightHeadWait=1.0, lasHalfLifeSeconds=0)
    policy.on_complete("a", 0, 0, 0.0)
    policy.on_complete("b", 1000, 0, 0.0)
    band = _band(policy)
    _push(band, "a", 0, 99.0)
    _push(band, "b", 1, 10.0)
    flow = policy.select_flow(band, 100.0)
    assert flow is not None and flow.flow_id == "b"


@pytest.mark.parametrize(
    ("input_tokens", "output_tokens", "expected"),
    [
        pytest.param(100, 0, 100.0, id="input-weight-1"),
        pytest.param(0, 100, 200.0, id="output-weight-2"),
        pytest.param(30, 20, 70.0, id="mixed"),
    ],
)
def test_las_charges_weighted_tokens_when_request_completes(
    input_tokens: int, output_tokens: int, expected: float
) -> None:
    policy = _las(lasHalfLifeSeconds=0)
    policy.on_complete("p", input_tokens, output_tokens, 5.0)
    assert policy.programs["p"].service == pytest.approx(expected)


@pytest.mark.parametrize(
    ("elapsed", "half_life", "expected"),
    [
        pytest.param(60.0, 60.0, 50.0, id="one-half-life"),
        pytest.param(120.0, 60.0, 25.0, id="two-half-lives"),
        pytest.param(30.0, 60.0, 100.0 * 2**-0.5, id="half-a-half-life"),
        pytest.param(600.0, 0.0, 100.0, id="no-decay"),
    ],
)
def test_las_service_decays_when_time_passes(
    elapsed: float, half_life: float, expected: float
) -> None:
    policy = _las(lasHalfLifeSeconds=half_life)
    policy.on_complete("p", 100, 0, 0.0)
    assert policy.programs["p"].decayed(elapsed, half_life) == pytest.approx(expected)


def test_las_tracks_wait_and_in_flight_when_dispatched_and_completed() -> None:
    policy = _las()
    band = _band(policy)
    _push(band, "p", 0, 10.0)
    _push(band, "q", 1, 10.0)
    assert _dispatch(band, policy, now=10.25) in {"p-0", "q-1"}
    assert _dispatch(band, policy, now=10.75) in {"p-0", "q-1"}
    waits = sorted(p.avg_wait_ms for p in policy.programs.values())
    assert waits == [250.0, 750.0]
    assert policy.fairness_index() == pytest.approx((250 + 750) ** 2 / (2 * (250**2 + 750**2)))
    assert all(p.in_flight == 1 for p in policy.programs.values())
    policy.on_complete("p", 1, 1, 11.0)
    assert policy.programs["p"].in_flight == 0


def test_las_forgets_idle_programs_when_ttl_passed() -> None:
    policy = _las(evictionTtlSeconds=10, evictionSweepSeconds=5)
    policy.on_complete("old", 1, 0, 0.0)  # arms the sweep at t=5
    band = _band(policy)
    _push(band, "busy", 0, 0.0)
    busy = band.flows["busy"]
    policy.on_dispatch(band, busy, band.pop(busy, 0.0), 0.0)
    policy.select_flow(band, 11.0)
    assert set(policy.programs) == {"busy"}


def test_las_keeps_idle_programs_when_ttl_is_zero() -> None:
    policy = _las(evictionTtlSeconds=0, evictionSweepSeconds=5)
    policy.on_complete("old", 1, 0, 0.0)  # arms the sweep at t=5
    policy.on_complete("new", 1, 0, 100.0)
    assert set(policy.programs) == {"old", "new"}


def test_las_forgets_the_idlest_program_when_over_max_programs() -> None:
    h = handle()
    policy: ProgramAwareFairness = build_plugin(h, "program-aware-fairness", maxPrograms=3)
    band = _band(policy)
    _push(band, "busy", 0, 0.0)
    busy = band.flows["busy"]
    policy.on_dispatch(band, busy, band.pop(busy, 0.0), 0.0)  # oldest, but in flight
    for t, pid in enumerate(("a", "b", "a", "c"), start=1):
        policy.on_complete(pid, 1, 0, float(t))
    # "b" was idle longest ("a" completed again after it) and is forgotten with its series
    assert set(policy.programs) == {"busy", "a", "c"}
    name = "llm_d_epp_program_aware_attained_service_tokens"
    assert h.registry.get_sample_value(name, {"program_id": "b"}) is None
    assert h.registry.get_sample_value(name, {"program_id": "c"}) == 1.0
    for i in range(100):  # a client cycling fairness ids
        policy.on_complete(f"x{i}", 1, 0, 10.0 + i)
    assert len(policy.programs) == 3 and "busy" in policy.programs


def test_second_instance_loads_when_metrics_already_registered() -> None:
    h = handle()
    first = build_plugin(h, "program-aware-fairness", "a")
    second = build_plugin(h, "program-aware-fairness", "b")
    second.on_complete("p", 5, 0, 0.0)
    first.on_complete("p", 1, 0, 0.0)
    value = h.registry.get_sample_value(
        "llm_d_epp_program_aware_attained_service_tokens", {"program_id": "p"}
    )
    assert value == 1.0


def test_program_series_fold_into_other_when_over_1000_programs() -> None:
    h = handle()
    policy = build_plugin(h, "program-aware-fairness")
    for i in range(1001):
        policy.on_complete(f"p{i}", 1, 0, 0.0)
    policy.on_complete("p1000", 1, 0, 0.0)
    name = "llm_d_epp_program_aware_attained_service_tokens"
    assert h.registry.get_sample_value(name, {"program_id": "p999"}) == 1.0
    assert h.registry.get_sample_value(name, {"program_id": "p1000"}) is None
    assert h.registry.get_sample_value(name, {"program_id": "other"}) == 2.0


def test_program_series_fold_into_other_when_the_id_is_over_128_characters() -> None:
    h = handle()
    policy = build_plugin(h, "program-aware-fairness")
    policy.on_complete("x" * 129, 1, 0, 0.0)
    policy.on_complete("y" * 128, 1, 0, 0.0)
    name = "llm_d_epp_program_aware_attained_service_tokens"
    assert h.registry.get_sample_value(name, {"program_id": "other"}) == 1.0
    assert h.registry.get_sample_value(name, {"program_id": "y" * 128}) == 1.0
    assert h.registry.get_sample_value(name, {"program_id": "x" * 129}) is None


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([], 1.0, id="no-programs"),
        pytest.param([300.0], 1.0, id="one-program"),
        pytest.param([100.0, 100.0, 100.0], 1.0, id="equal-waits"),
        pytest.param([100.0, 0.0], 0.5, id="one-starved-of-two"),
        pytest.param([1.0, 2.0, 3.0], 36 / 42, id="spread"),
    ],
)
def test_jain_index_follows_formula_when_waits_given(values: list[float], expected: float) -> None:
    assert jain_index(values) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"lasWeightService": -1}, "las_weight_service", id="negative-weight"),
        pytest.param({"evictionSweepSeconds": 0}, "evictionSweepSeconds", id="zero-sweep"),
        pytest.param({"maxPrograms": 0}, "maxPrograms", id="zero-max-programs"),
        pytest.param({"strategy": "drr"}, "must be one of", id="unknown-strategy"),
    ],
)
def test_las_rejects_params_when_out_of_range(params: dict[str, object], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(ProgramAwareFairness.Params, params)
