"""``utilization-filter``: every condition caps one metric; an endpoint over any cap is dropped."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import Filter, Stability
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter, sample_endpoints
from filters.utilization import UtilizationFilter
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _filter(**params: Any) -> UtilizationFilter:
    return UtilizationFilter(
        name="u", params=decode(UtilizationFilter.Params, params), handle=handle()
    )


def _kept(flt: UtilizationFilter, endpoints: list[Any], **request: Any) -> list[int]:
    out = flt.filter(make_cycle(), make_request(**request), endpoints)
    return [endpoints.index(e) for e in out]


PODS = [
    make_endpoint(0, running=10, queue=0, kv=0.2),
    make_endpoint(1, running=50, queue=0, kv=0.3),
    make_endpoint(2, running=5, queue=2, kv=0.5),
    make_endpoint(3, running=20, queue=0, kv=0.9),
]


@pytest.mark.parametrize(
    ("conditions", "kept"),
    [
        ([{"metric": "running-requests", "maxValue": 40}], [0, 2, 3]),
        ([{"metric": "waiting-queue", "maxValue": 0}], [0, 1, 3]),
        ([{"metric": "kv-cache-utilization", "maxValue": 0.8}], [0, 1, 2]),
        ([{"metric": "kv-cache-utilization", "maxValue": 0.5}], [0, 1, 2]),  # equal passes
        (
            [
                {"metric": "running-requests", "maxValue": 40},
                {"metric": "waiting-queue", "maxValue": 0},
                {"metric": "kv-cache-utilization", "maxValue": 0.8},
            ],
            [0],
        ),
    ],
)
def test_an_endpoint_over_any_cap_is_dropped(conditions: list[Any], kept: list[int]) -> None:
    assert _kept(_filter(conditions=conditions), PODS) == kept


def test_active_requests_come_from_the_in_flight_load() -> None:
    flt = _filter(conditions=[{"metric": "active-requests", "maxValue": 2}])
    assert flt.consumes() == {INFLIGHT_LOAD.key("inflight-load-producer")}
    loads = {PODS[0].id: InFlightLoad(3, 0), PODS[1].id: InFlightLoad(2, 900)}
    attributes = {INFLIGHT_LOAD.key("inflight-load-producer"): loads}
    # pod-0 is over; pod-1 at the cap passes; pods 2 and 3 are not in the data: 0 requests
    assert _kept(flt, PODS, attributes=attributes) == [1, 2, 3]
    named = _filter(
        conditions=[{"metric": "active-requests", "maxValue": 0}],
        inFlightLoadProducerName="mine",
    )
    assert named.consumes() == {INFLIGHT_LOAD.key("mine")}
    assert _kept(named, PODS, attributes={INFLIGHT_LOAD.key("mine"): loads}) == [2, 3]


def test_scraped_metrics_alone_consume_nothing() -> None:
    assert _filter(conditions=[{"metric": "waiting-queue", "maxValue": 0}]).consumes() == set()


def test_an_endpoint_without_metrics_counts_as_zero() -> None:
    bare = dataclasses.replace(make_endpoint(9), metrics=None)
    flt = _filter(conditions=[{"metric": "running-requests", "maxValue": 0}])
    assert _kept(flt, [bare, PODS[0]]) == [0]


def test_fallback_on_empty_returns_the_candidates() -> None:
    cap = [{"metric": "kv-cache-utilization", "maxValue": 0.1}]
    assert _kept(_filter(conditions=cap), PODS) == []
    assert _kept(_filter(conditions=cap, fallbackOnEmpty=True), PODS) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "requires at least one condition"),
        ({"conditions": []}, "requires at least one condition"),
        ({"conditions": [{"metric": "gpu", "maxValue": 1}]}, "metric must be one of"),
        ({"conditions": [{"metric": "waiting-queue"}]}, "requires maxValue"),
        ({"conditions": [{"metric": "waiting-queue", "maxValue": -1}]}, "non-negative"),
        ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 80}]}, "at most 1"),
        ({"conditions": [{"metric": "waiting-queue", "maxValue": 1, "x": 1}]}, "unknown field"),
    ],
)
def test_parameters_are_checked(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(UtilizationFilter.Params, params)


def test_is_an_alpha_filter_that_passes_the_contract_kit() -> None:
    flt = _filter(conditions=[{"metric": "waiting-queue", "maxValue": 3}])
    assert isinstance(flt, Filter) and UtilizationFilter.STABILITY is Stability.ALPHA
    for n in (0, 1, 7, 50):
        check_filter(flt, sample_endpoints(n, seed=n), make_request())
