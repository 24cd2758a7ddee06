"""``prefix-cache-affinity-filter``: stick to the endpoints that cache the prompt, unless the TTFT
they would give is too far behind a cold endpoint's."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import PREFIX_MATCH_INFO, PrefixMatchInfo
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.latency import LATENCY_PREDICTION_INFO, LatencyPredictionInfo
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter
from filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

PREFIX = PREFIX_MATCH_INFO.key("approx-prefix-cache-producer")
LOAD = INFLIGHT_LOAD.key("inflight-load-producer")
LATENCY = LATENCY_PREDICTION_INFO.key("predicted-latency-producer")
EPS = [make_endpoint(i) for i in range(4)]
ALL = [e.name for e in EPS]


def _filter(**params: Any) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(
        name="affinity",
        params=decode(PrefixCacheAffinityFilter.Params, params),
        handle=FakeHandle(),
    )


def _request(matched: dict[int, int], **attrs: Any) -> Any:
    """Match info of 10 blocks; endpoint i holds ``matched[i]`` of them."""
    infos = {EPS[i].id: PrefixMatchInfo(m, 10, 16) for i, m in matched.items()}
    return make_request(attributes={PREFIX: infos, **attrs})


def _loads(tokens: dict[int, int]) -> dict[str, Any]:
    return {LOAD: {EPS[i].id: InFlightLoad(1, t) for i, t in tokens.items()}}


def _predicted(ttft: dict[int, float]) -> dict[str, Any]:
    return {
        LATENCY: {EPS[i].id: LatencyPredictionInfo(True, True, 0, 0, t, 0) for i, t in ttft.items()}
    }


def _kept(flt: PrefixCacheAffinityFilter, request: Any, seed: int = 0) -> list[str]:
    return [e.name for e in flt.filter(make_cycle(seed), request, EPS)]


def test_keeps_endpoints_at_or_above_the_threshold() -> None:
    request = _request({0: 10, 1: 8, 2: 7, 3: 0})
    assert _kept(_filter(), request) == ["pod-0", "pod-1"]
    assert _kept(_filter(affinityThreshold=0.99), request) == ["pod-0"]


@pytest.mark.parametrize(
    "request_",
    [make_request(), make_request(attributes={PREFIX: {}})],
    ids=["no-match-info", "empty-match-info"],
)
def test_no_sticky_endpoint_keeps_all(request_: Any) -> None:
    assert _kept(_filter(), request_) == ALL


def test_zero_threshold_turns_the_filter_off() -> None:
    assert _kept(_filter(affinityThreshold=0.0), _request({0: 10})) == ALL


def test_load_gate_from_in_flight_tokens() -> None:
    """Sticky pod-0 has 100,000 tokens in flight: 6.3 s at the default 15,928 tokens/s, while
    cold pod-1 has none. A 5 s penalty breaks stickiness, a 7 s one keeps it."""
    request = _request({0: 10}, **_loads({0: 100_000, 1: 0, 2: 50_000, 3: 50_000}))
    assert _kept(_filter(maxTTFTPenaltyMs=5000), request) == ALL
    assert _kept(_filter(maxTTFTPenaltyMs=7000), request) == ["pod-0"]
    assert _kept(_filter(maxTTFTPenaltyMs=0), request) == ["pod-0"]  # 0: always stick


def test_load_gate_compares_the_best_of_each_side() -> None:
    loads = _loads({0: 200_000, 1: 0, 2: 150_000, 3: 150_000})
    request = _request({0: 10, 1: 10}, **loads)  # the best sticky endpoint is idle
    assert _kept(_filter(maxTTFTPenaltyMs=1), request) == ["pod-0", "pod-1"]


def test_load_gate_from_the_latency_predictor() -> None:
    request = _request({0: 10}, **_predicted({0: 900.0, 1: 100.0, 2: 400.0, 3: 400.0}))
    flt = _filter(ttftSource="latencyPredictor", maxTTFTPenaltyMs=500)
    assert _kept(flt, request) == ALL  # 900 - 100 > 500
    assert _kept(_filter(ttftSource="latencyPredictor", maxTTFTPenaltyMs=900), request) == ["pod-0"]
    assert flt.consumes() == {PREFIX, LATENCY}


def test_predictor_gate_without_predictions_sticks() -> None:
    flt = _filter(ttftSource="latencyPredictor", maxTTFTPenaltyMs=1)
    assert _kept(flt, _request({0: 10})) == ["pod-0"]
    # only the cold side predicted: the sticky side counts as infinitely slow
    assert _kept(flt, _request({0: 10}, **_predicted({1: 100.0}))) == ALL


def test_exploration_skips_the_gate_at_its_rate() -> None:
    flt = _filter(explorationProbability=0.2)
    request = _request({0: 10})
    explored = sum(_kept(flt, request, seed) == ALL for seed in range(2000))
    assert 320 < explored < 480  # 20% of 2000, within sampling noise


def test_consumes_follows_the_gate() -> None:
    assert _filter().consumes() == {PREFIX, LOAD}
    assert _filter(maxTTFTPenaltyMs=0).consumes() == {PREFIX}
    named = _filter(prefixMatchInfoProducerName="p", inFlightLoadProducerName="l")
    assert named.consumes() == {PREFIX_MATCH_INFO.key("p"), INFLIGHT_LOAD.key("l")}


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"affinityThreshold": 1.5}, "affinityThreshold"),
        ({"explorationProbability": 2}, "explorationProbability"),
        ({"maxTTFTPenaltyMs": -1}, "maxTTFTPenaltyMs"),
        ({"peakPrefillThroughput": -1}, "peakPrefillThroughput"),
        ({"peakPrefillThroughput": 0}, "peakPrefillThroughput"),
        ({"ttftSource": "guess"}, "ttftSource"),
    ],
)
def test_invalid_parameters_are_refused(params: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError, match=field):
        decode(PrefixCacheAffinityFilter.Params, params)


def test_zero_throughput_is_fine_when_unused() -> None:
    decode(PrefixCacheAffinityFilter.Params, {"peakPrefillThroughput": 0, "maxTTFTPenaltyMs": 0})
    decode(
        PrefixCacheAffinityFilter.Params,
        {"peakPrefillThroughput": 0, "ttftSource": "latencyPredictor"},
    )


def test_contract() -> None:
    check_filter(_filter(), EPS, _request({0: 10, 1: 9}, **_loads({0: 1000})))
