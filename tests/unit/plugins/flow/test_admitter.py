from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from epp.plugin import Admitter, DropReason, Endpoint, ErrorCode, SaturationDetector
from epp.plugin.params import ParamError, decode
from epp.plugins.flow.admitter import ProbabilisticAdmitter
from tests.builders import handle, make_cycle, make_endpoint
from tests.unit.flowcontrol.flow_builders import build_plugin, request


def _admitter(**params: Any) -> ProbabilisticAdmitter:
    admitter: ProbabilisticAdmitter = build_plugin(handle(), "probabilistic-admitter", **params)
    return admitter


def _no_metrics(i: int) -> Endpoint:
    return dataclasses.replace(make_endpoint(i), metrics=None)


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        pytest.param([make_endpoint(0)], 0.0, id="idle"),
        pytest.param([make_endpoint(0, queue=5)], 1.0, id="queue-at-threshold"),
        pytest.param([make_endpoint(0, queue=1, kv=0.4)], 0.5, id="kv-dominates"),
        pytest.param([make_endpoint(0, queue=2), _no_metrics(1)], 0.7, id="missing-metrics-one"),
    ],
)
def test_saturation_is_mean_of_endpoint_max_when_metrics_given(
    endpoints: list[Endpoint], expected: float
) -> None:
    assert _admitter().pool_saturation(endpoints) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("params", "saturation", "expected"),
    [
        pytest.param({}, 0.0, 0.0, id="idle"),
        pytest.param({}, 0.2, 0.2**5 * 300, id="defaults-low"),
        pytest.param({}, 0.3, 0.3**5 * 300, id="defaults-mid"),
        pytest.param({}, (1 / 300) ** 0.2, pytest.approx(1.0), id="defaults-knee"),
        pytest.param({}, 0.5, 1.0, id="defaults-capped"),
        pytest.param({"power": 2, "k": 1}, 0.5, 0.25, id="custom-curve"),
    ],
)
def test_rejection_probability_follows_formula_when_saturation_given(
    params: dict[str, Any], saturation: float, expected: float
) -> None:
    assert _admitter(**params).rejection_probability(saturation) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("offset", "rejected"),
    [
        pytest.param(1e-6, True, id="draw-just-below-p"),
        pytest.param(0.0, False, id="draw-equal-to-p-admitted"),
        pytest.param(-1e-6, False, id="draw-just-above-p"),
    ],
)
def test_sheddable_request_rejected_when_draw_below_probability(
    offset: float, rejected: bool
) -> None:
    draw = random.Random(3).random()  # the first draw the seeded cycle will make
    endpoints = [make_endpoint(0, queue=1)]  # saturation 0.2
    admitter = _admitter(power=1.0, k=(draw + offset) / 0.2)  # p = 0.2 * k = draw + offset
    denial = admitter.admit(make_cycle(seed=3), request(priority=-1), endpoints)
    assert (denial is not None) is rejected


def test_rejection_is_429_with_drop_reason_when_denied() -> None:
    denial = _admitter().admit(make_cycle(), request(priority=-1), [make_endpoint(0, queue=5)])
    assert denial is not None
    assert denial.code is ErrorCode.RESOURCE_EXHAUSTED
    assert denial.code.http_status == 429
    assert denial.drop_reason == DropReason.SATURATED
    assert denial.message == "probabilistic-admitter: rejected, saturation=1.000 prob=1.00"


@pytest.mark.parametrize(
    ("priority", "endpoints"),
    [
        pytest.param(0, [make_endpoint(0, queue=50)], id="priority-zero-protected"),
        pytest.param(3, [make_endpoint(0, queue=50)], id="positive-protected"),
        pytest.param(-1, [], id="no-endpoints"),
    ],
)
def test_request_admitted_when_not_sheddable_or_no_endpoints(
    priority: int, endpoints: list[Endpoint]
) -> None:
    assert _admitter().admit(make_cycle(), request(priority=priority), endpoints) is None


def test_shedding_rate_matches_probability_when_seeded() -> None:
    admitter = _admitter()
    endpoints = [make_endpoint(0, queue=1, kv=0.24)]  # saturation 0.3 -> p = 0.729
    cycle = make_cycle(seed=7)
    rejected = sum(
        admitter.admit(cycle, request(f"r{i}", priority=-2), endpoints) is not None
        for i in range(2000)
    )
    assert rejected == pytest.approx(0.729 * 2000, abs=60)


def test_admitter_fills_only_the_admitter_role_when_loaded() -> None:
    admitter = _admitter()
    assert isinstance(admitter, Admitter)
    assert not isinstance(admitter, SaturationDetector)


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"queueDepthThreshold": 0}, id="queue"),
        pytest.param({"kvCacheUtilThreshold": 0.0}, id="kv"),
        pytest.param({"power": -1.0}, id="power"),
        pytest.param({"k": 0}, id="k"),
    ],
)
def test_params_rejected_when_not_positive(params: dict[str, Any]) -> None:
    with pytest.raises(ParamError, match="must be > 0"):
        decode(ProbabilisticAdmitter.Params, params)
