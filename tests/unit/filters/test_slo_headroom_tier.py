"""``slo-headroom-tier-filter``: the endpoints predicted to meet the SLOs, with rare exploration."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin.latency import LATENCY_PREDICTION_INFO, LatencyPredictionInfo
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter
from filters.slo_headroom_tier import SLOHeadroomTierFilter
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

KEY = LATENCY_PREDICTION_INFO.key("predicted-latency-producer")
EPS = [make_endpoint(i) for i in range(4)]


def _filter(**params: Any) -> SLOHeadroomTierFilter:
    return SLOHeadroomTierFilter(
        name="tier", params=decode(SLOHeadroomTierFilter.Params, params), handle=FakeHandle()
    )


def _info(ttft_headroom: float, tpot_headroom: float = 0.0) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(
        ttft_headroom >= 0, tpot_headroom >= 0, ttft_headroom, tpot_headroom, 100.0, 10.0
    )


def _request(headrooms: dict[int, tuple[float, float]], key: str = KEY) -> Any:
    infos = {EPS[i].id: _info(*h) for i, h in headrooms.items()}
    return make_request(attributes={key: infos})


def _kept(flt: SLOHeadroomTierFilter, request: Any, seed: int = 0) -> list[str]:
    return [e.name for e in flt.filter(make_cycle(seed), request, EPS)]


def test_keeps_only_endpoints_meeting_both_slos() -> None:
    request = _request({0: (10, 1), 1: (-5, 1), 2: (3, -1), 3: (0, 0)})
    assert _kept(_filter(epsilonExploreNeg=0.0), request) == ["pod-0", "pod-3"]


def test_endpoint_without_prediction_is_in_the_negative_tier() -> None:
    request = _request({0: (10, 1)})
    assert _kept(_filter(epsilonExploreNeg=0.0), request) == ["pod-0"]
    assert _kept(_filter(epsilonExploreNeg=1.0), request) == ["pod-1", "pod-2", "pod-3"]


def test_explores_the_negative_tier_at_the_configured_rate() -> None:
    flt = _filter(epsilonExploreNeg=0.25)
    request = _request({0: (10, 1), 1: (-5, 1), 2: (-3, 1), 3: (-1, -1)})
    negative = sum(_kept(flt, request, seed) != ["pod-0"] for seed in range(2000))
    assert 400 < negative < 600  # 25% of 2000, within sampling noise


def test_single_tier_is_kept_whole() -> None:
    everyone_late = _request({i: (-10.0 * (i + 1), 0) for i in range(4)})
    assert _kept(_filter(epsilonExploreNeg=0.0), everyone_late) == [e.name for e in EPS]


@pytest.mark.parametrize(
    "request_", [make_request(), make_request(attributes={KEY: {}})], ids=["absent", "empty"]
)
def test_without_predictions_every_candidate_is_kept(request_: Any) -> None:
    assert _kept(_filter(), request_) == [e.name for e in EPS]


def test_reads_the_named_producer() -> None:
    other = LATENCY_PREDICTION_INFO.key("other")
    request = _request({0: (10, 1), 1: (-5, 1)}, key=other)
    assert _kept(_filter(epsilonExploreNeg=0.0), request) == [e.name for e in EPS]
    named = _filter(epsilonExploreNeg=0.0, latencyPredictionInfoProducerName="other")
    assert _kept(named, request) == ["pod-0"]
    assert named.consumes() == {other}


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_epsilon_outside_zero_one_is_refused(value: float) -> None:
    with pytest.raises(ParamError, match="epsilonExploreNeg"):
        decode(SLOHeadroomTierFilter.Params, {"epsilonExploreNeg": value})


def test_contract() -> None:
    check_filter(_filter(), EPS, _request({0: (10, 1), 1: (-5, 1)}))
