"""``latency-scorer``: headroom-based scores, idle preference, deficit buckets and the composite
fallback without predictions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import PREFIX_MATCH_INFO, PrefixMatchInfo
from epp.plugin.latency import LATENCY_PREDICTION_INFO, LatencyPredictionInfo
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_scorer
from scorers.latency import LatencyScorer
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

KEY = LATENCY_PREDICTION_INFO.key("predicted-latency-producer")
PREFIX = PREFIX_MATCH_INFO.key("approx-prefix-cache-producer")
EPS = [make_endpoint(i) for i in range(4)]


def _scorer(**params: Any) -> LatencyScorer:
    return LatencyScorer(
        name="latency", params=decode(LatencyScorer.Params, params), handle=FakeHandle()
    )


def _info(ttft_h: float, tpot_h: float = 0.0, dispatched: int = 1) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(ttft_h >= 0, tpot_h >= 0, ttft_h, tpot_h, 0.0, 0.0, dispatched)


def _scores(scorer: LatencyScorer, infos: dict[int, LatencyPredictionInfo]) -> list[float]:
    request = make_request(attributes={KEY: {EPS[i].id: v for i, v in infos.items()}})
    result = scorer.score(make_cycle(), request, EPS)
    return [result[e.id] for e in EPS]


def test_least_strategy_prefers_the_endpoint_closest_to_its_slo() -> None:
    scores = _scores(_scorer(), {0: _info(10), 1: _info(40), 2: _info(100), 3: _info(70)})
    # ttft headrooms 10..100 normalised over 90 ms; tpot all 0: weights become (1, 0)
    assert scores == [1.0, pytest.approx(0.67), 0.01, pytest.approx(0.34)]


def test_most_strategy_prefers_the_most_headroom() -> None:
    scorer = _scorer(headroomSelectionStrategy="most")
    scores = _scores(scorer, {0: _info(10), 1: _info(40), 2: _info(100), 3: _info(70)})
    assert scores == [0.01, pytest.approx(0.34), 1.0, pytest.approx(0.67)]


def test_negative_endpoints_score_zero_when_some_meet_the_slo() -> None:
    scores = _scores(_scorer(), {0: _info(10), 1: _info(-5), 2: _info(30, -1), 3: _info(50)})
    assert scores[1] == scores[2] == 0.0
    assert scores[0] > scores[3] > 0


def test_all_negative_prefers_idle_endpoints() -> None:
    infos = {0: _info(-10), 1: _info(-500, dispatched=0), 2: _info(-20), 3: _info(-900, -5, 0)}
    scores = _scores(_scorer(), infos)
    assert scores[0] == scores[2] == 0.0
    assert scores[1] == 1.0  # the idle one closest to its SLO
    assert 0 < scores[3] < scores[1]


def test_deficit_buckets_prefer_tpot_only_then_ttft_only() -> None:
    both = _info(-10, -10)
    tpot_only = _scores(_scorer(), {0: both, 1: _info(5, -300), 2: _info(-1, 3), 3: both})
    assert tpot_only[1] > 0 and tpot_only[0] == tpot_only[2] == tpot_only[3] == 0.0
    ttft_only = _scores(_scorer(), {0: both, 1: _info(-300, 5), 2: _info(-200, -1), 3: both})
    assert ttft_only[1] > 0 and ttft_only[0] == ttft_only[2] == ttft_only[3] == 0.0
    only_both = _scores(_scorer(), {0: both, 1: _info(-1, -900), 2: both, 3: both})
    assert only_both[1] > 0  # nothing better: the both-negative bucket is scored


def test_without_slo_routes_to_the_lowest_predicted_latency() -> None:
    # no SLO header: headroom = -predicted on both, every endpoint busy
    predicted = [(300, 20), (120, 25), (500, 10), (200, 30)]
    infos = {i: _info(-ttft, -tpot) for i, (ttft, tpot) in enumerate(predicted)}
    scores = _scores(_scorer(), infos)
    assert max(range(4), key=scores.__getitem__) == 1


def test_weights_blend_both_dimensions() -> None:
    infos = {0: _info(10, 9), 1: _info(100, 1), 2: _info(55, 5)}
    ttft_heavy = _scores(_scorer(ttftWeight=1, tpotWeight=0), infos)
    tpot_heavy = _scores(_scorer(ttftWeight=0, tpotWeight=1), infos)
    assert ttft_heavy[0] > ttft_heavy[1]
    assert tpot_heavy[1] > tpot_heavy[0]


def test_endpoint_without_prediction_counts_as_zero_headroom() -> None:
    scores = _scores(_scorer(), {0: _info(50), 1: _info(100)})
    assert scores[2] == scores[3] == 1.0  # upstream: no prediction = headroom 0, closest to SLO


def test_composite_fallback_without_predictions() -> None:
    eps = [make_endpoint(0, queue=0, kv=0.5), make_endpoint(1, queue=4, kv=0.0),
           dataclasses.replace(make_endpoint(2), metrics=None)]  # fmt: skip
    prefix = {eps[1].id: PrefixMatchInfo(10, 10, 16)}
    request = make_request(attributes={PREFIX: prefix})
    scores = _scorer().score(make_cycle(), request, eps)
    # (kv free + relative queue + prefix) / 3
    assert scores[eps[0].id] == pytest.approx(round((0.5 + 1.0 + 0.0) / 3, 2))
    assert scores[eps[1].id] == pytest.approx(round((1.0 + 0.0 + 1.0) / 3, 2))
    assert scores[eps[2].id] == pytest.approx(round((1.0 + 1.0 + 0.0) / 3, 2))
    kv_only = _scorer(compositeQueueWeight=0, compositePrefixWeight=0).score(
        make_cycle(), request, eps
    )
    assert kv_only[eps[0].id] == 0.5 and kv_only[eps[1].id] == 1.0


def test_composite_weights_all_zero_fall_back_to_kv() -> None:
    scorer = _scorer(compositeKVWeight=0, compositeQueueWeight=0, compositePrefixWeight=0)
    eps = [make_endpoint(0, kv=0.25)]
    assert scorer.score(make_cycle(), make_request(), eps) == {eps[0].id: 0.75}


@pytest.mark.parametrize(
    "params",
    [{"ttftWeight": -1}, {"compositeKVWeight": -0.5}, {"headroomSelectionStrategy": "fastest"}],
)
def test_invalid_parameters_are_refused(params: dict[str, Any]) -> None:
    with pytest.raises(ParamError):
        decode(LatencyScorer.Params, params)


def test_contract() -> None:
    infos = {e.id: _info(10.0 * i - 15) for i, e in enumerate(EPS)}
    check_scorer(_scorer(), EPS, make_request(attributes={KEY: infos}))
    check_scorer(_scorer(), EPS, make_request())
