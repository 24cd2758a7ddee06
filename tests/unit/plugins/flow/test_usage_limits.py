from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import Stability
from epp.plugin.params import ParamError, decode
from epp.plugins.flow.usage_limits import (
    PriorityHoldbackPolicy,
    SoftReflectiveCeilingPolicy,
    StaticUsageLimitPolicy,
)
from tests.builders import handle
from tests.unit.flowcontrol.flow_builders import build_plugin


def _limits(type_name: str, saturation: float, priorities: list[int], **params: Any) -> list[float]:
    policy = build_plugin(handle(), type_name, **params)
    return list(policy.compute_limit(saturation, priorities))


@pytest.mark.parametrize(
    ("params", "priorities", "expected"),
    [
        pytest.param({}, [10, 0, -1], [1.0, 1.0, 1.0], id="default-no-gating"),
        pytest.param({"threshold": 0.7}, [5, 0], [0.7, 0.7], id="custom-threshold"),
        pytest.param({}, [], [], id="no-bands"),
    ],
)
def test_static_ceiling_is_threshold_when_any_saturation(
    params: dict[str, Any], priorities: list[int], expected: list[float]
) -> None:
    assert _limits("static-usage-limit-policy", 0.9, priorities, **params) == expected


@pytest.mark.parametrize(
    ("params", "priorities", "expected"),
    [
        pytest.param(
            {"minCeiling": 0.4, "maxCeiling": 0.9},
            [10, 5, 0],
            [0.9, 0.65, 0.4],
            id="rank-three-bands",
        ),
        pytest.param(
            {"minCeiling": 0.2},
            [100, 7, 3, -50, -99],
            [1.0, 0.8, 0.6, 0.4, 0.2],
            id="rank-ignores-values",
        ),
        pytest.param(
            {"minCeiling": 0.4, "maxCeiling": 0.9, "domain": "value"},
            [10, 8, 0],
            [0.9, 0.8, 0.4],
            id="value-proportional",
        ),
        pytest.param(
            {"minCeiling": 0.0, "domain": "value"},
            [4, -4],
            [1.0, 0.0],
            id="value-negative-range",
        ),
        pytest.param({"minCeiling": 0.3, "maxCeiling": 0.8}, [7], [0.8], id="single-band-gets-max"),
        pytest.param(
            {"minCeiling": 0.3, "domain": "value"},
            [2, 2],
            [1.0, 1.0],
            id="value-equal-priorities-get-max",
        ),
    ],
)
def test_holdback_ceilings_follow_formula_when_domain_given(
    params: dict[str, Any], priorities: list[int], expected: list[float]
) -> None:
    got = _limits("priority-holdback-policy", 0.5, priorities, **params)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({}, "minCeiling: required", id="min-required"),
        pytest.param({"minCeiling": 1.0}, r"minCeiling must be in \[0, 1\)", id="min-too-big"),
        pytest.param({"minCeiling": 0.5, "maxCeiling": 0.5}, "less than", id="min-not-below-max"),
        pytest.param({"minCeiling": 0.1, "maxCeiling": 0.0}, "maxCeiling", id="max-zero"),
        pytest.param({"minCeiling": 0.1, "shape": "sigmoid"}, "must be one of", id="bad-shape"),
        pytest.param({"minCeiling": 0.1, "domain": "log"}, "must be one of", id="bad-domain"),
    ],
)
def test_holdback_rejects_params_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(PriorityHoldbackPolicy.Params, params)


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01])
def test_static_rejects_threshold_when_outside_unit_interval(threshold: float) -> None:
    with pytest.raises(ParamError, match="threshold"):
        decode(StaticUsageLimitPolicy.Params, {"threshold": threshold})


@pytest.mark.parametrize(
    ("saturation", "priorities", "expected"),
    [
        pytest.param(0.3, [2, 1, 0], [1.0, 1.0, 1.0], id="light-load-all-open"),
        pytest.param(1.0, [2, 1, 0], [1.0, 0.0, 0.0], id="saturated-only-top-band"),
        pytest.param(1.5, [1, 0], [1.0, 0.0], id="overloaded"),
        pytest.param(0.9, [5], [1.0], id="single-band-always-open"),
        pytest.param(0.0, [], [], id="no-bands"),
        # reflective_1 = 1 - 0.45/2 = 0.775 > 0.45 -> open; reflective_2 = 0.55 > 0.45 -> open
        pytest.param(0.45, [2, 1, 0], [1.0, 1.0, 1.0], id="below-alternating-regime"),
    ],
)
def test_soft_reflective_ceilings_follow_formula_when_not_alternating(
    saturation: float, priorities: list[int], expected: list[float]
) -> None:
    assert _limits("soft-reflective-ceiling-policy", saturation, priorities) == expected


@pytest.mark.parametrize(
    ("saturation", "period"),
    [
        pytest.param(0.5, 1, id="half-every-call"),
        pytest.param(0.75, 3, id="three-quarters-every-third"),
        pytest.param(0.8, 4, id="period-four"),
        pytest.param(0.9, 9, id="period-nine"),
    ],
)
def test_soft_reflective_alternates_with_period_when_past_ceiling(
    saturation: float, period: int
) -> None:
    policy = build_plugin(handle(), "soft-reflective-ceiling-policy")
    opens = [policy.compute_limit(saturation, [1, 0])[1] for _ in range(period * 3)]
    assert opens.count(1.0) == 3
    assert all(opens[i] == (1.0 if (i + 1) % period == 0 else 0.0) for i in range(len(opens)))


def test_soft_reflective_gates_bands_together_when_alternating() -> None:
    policy = build_plugin(handle(), "soft-reflective-ceiling-policy")
    # s = 0.7, 4 bands: reflective = 1, 0.767, 0.533, 0.3: band 1 open, bands 2 and 3 alternate
    calls = [list(policy.compute_limit(0.7, [3, 2, 1, 0])) for _ in range(4)]
    for ceilings in calls:
        assert ceilings[0] == 1.0 and ceilings[1] == 1.0
        assert ceilings[2] == ceilings[3]
    assert [c[3] for c in calls] == [0.0, 1.0, 0.0, 1.0]  # period round(0.7/0.3) = 2


def test_soft_reflective_rejects_parameters_when_given() -> None:
    with pytest.raises(ParamError, match="unknown field"):
        decode(SoftReflectiveCeilingPolicy.Params, {"period": 3})


@pytest.mark.parametrize(
    ("cls", "stability"),
    [
        pytest.param(StaticUsageLimitPolicy, Stability.BETA, id="static"),
        pytest.param(PriorityHoldbackPolicy, Stability.ALPHA, id="holdback"),
        pytest.param(SoftReflectiveCeilingPolicy, Stability.ALPHA, id="soft-reflective"),
    ],
)
def test_stability_matches_upstream_when_plugin_registered(cls: type, stability: Stability) -> None:
    assert cls.STABILITY is stability  # type: ignore[attr-defined]
