from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import Consumer, Scorer, ScorerCategory
from epp.plugin.params import ParamError, decode
from scorers.prefix_cache import PrefixCacheScorer, PrefixMatchInfo
from tests.builders import handle, make_cycle, make_endpoint, make_request

KEY = "PrefixCacheMatchInfo/approx-prefix-cache-producer"


def _scorer(**params: Any) -> PrefixCacheScorer:
    return PrefixCacheScorer(
        name="", params=decode(PrefixCacheScorer.Params, params), handle=handle()
    )


@pytest.mark.parametrize(
    ("params", "info", "expected"),
    [
        pytest.param({}, PrefixMatchInfo(3, 4, 64), 0.75, id="ratio-only-by-default"),
        pytest.param({}, PrefixMatchInfo(0, 4, 64), 0.0, id="no-match"),
        pytest.param({}, PrefixMatchInfo(4, 4, 64), 1.0, id="full-match"),
        pytest.param({}, PrefixMatchInfo(2, 0, 64), 0.0, id="zero-total"),
        pytest.param(
            {"matchLengthWeight": 1.0}, PrefixMatchInfo(64, 128, 64), 0.25, id="length-only"
        ),
        pytest.param(
            {"matchLengthWeight": 1.0}, PrefixMatchInfo(200, 400, 64), 1.0, id="length-saturates"
        ),
        pytest.param(
            # ratio 0.5, lengthScore (32*64/8192)^2 = 0.0625 -> 0.5*0.0625 + 0.5*0.5
            {"matchLengthWeight": 0.5},
            PrefixMatchInfo(32, 64, 64),
            0.28125,
            id="blend",
        ),
        pytest.param(
            {"matchLengthWeight": 0.5, "matchLengthScaleTokens": 1024},
            PrefixMatchInfo(8, 10, 64),
            0.5 * 0.25 + 0.5 * 0.8,
            id="custom-scale",
        ),
        pytest.param(
            {"matchLengthWeight": 1.0}, PrefixMatchInfo(5, 10, 0), 0.0, id="zero-block-size"
        ),
    ],
)
def test_score_blends_ratio_and_length_when_match_info_present(
    params: dict[str, Any], info: PrefixMatchInfo, expected: float
) -> None:
    endpoint = make_endpoint(0)
    request = make_request(attributes={KEY: {endpoint.id: info}})
    scores = _scorer(**params).score(make_cycle(), request, [endpoint])
    assert scores == {endpoint.id: pytest.approx(expected)}


def test_score_is_zero_for_all_when_attribute_missing() -> None:
    endpoints = [make_endpoint(0), make_endpoint(1)]
    scores = _scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 0.0, endpoints[1].id: 0.0}


def test_score_is_zero_when_endpoint_absent_from_match_info() -> None:
    endpoints = [make_endpoint(0), make_endpoint(1)]
    request = make_request(attributes={KEY: {endpoints[0].id: PrefixMatchInfo(1, 2, 64)}})
    scores = _scorer().score(make_cycle(), request, endpoints)
    assert scores == {endpoints[0].id: 0.5, endpoints[1].id: 0.0}


def test_score_reads_named_producer_when_producer_configured() -> None:
    endpoint = make_endpoint(0)
    request = make_request(
        attributes={
            KEY: {endpoint.id: PrefixMatchInfo(1, 4, 64)},
            "PrefixCacheMatchInfo/precise": {endpoint.id: PrefixMatchInfo(3, 4, 64)},
        }
    )
    scorer = _scorer(prefixMatchInfoProducerName="precise")
    assert scorer.score(make_cycle(), request, [endpoint]) == {endpoint.id: 0.75}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, frozenset({KEY}), id="default-producer"),
        pytest.param(
            {"prefixMatchInfoProducerName": "p"},
            frozenset({"PrefixCacheMatchInfo/p"}),
            id="named-producer",
        ),
    ],
)
def test_consumes_names_producer_key_when_constructed(
    params: dict[str, Any], expected: frozenset[str]
) -> None:
    scorer = _scorer(**params)
    assert isinstance(scorer, Consumer)
    assert scorer.consumes() == expected


def test_params_default_when_not_configured() -> None:
    params = decode(PrefixCacheScorer.Params, None)
    assert (
        params.match_length_weight,
        params.match_length_scale_tokens,
        params.prefix_match_info_producer_name,
    ) == (0.0, 8192, "approx-prefix-cache-producer")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"matchLengthWeight": 1.5}, "matchLengthWeight", id="weight-above-one"),
        pytest.param({"matchLengthWeight": -0.1}, "matchLengthWeight", id="weight-negative"),
        pytest.param({"matchLengthScaleTokens": 0}, "matchLengthScaleTokens", id="scale-zero"),
        pytest.param(
            {"prefixMatchInfoProducerName": ""}, "prefixMatchInfoProducerName", id="empty"
        ),
        pytest.param({"blockSize": 16}, "blockSize", id="unknown-key"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(PrefixCacheScorer.Params, params)


def test_plugin_is_affinity_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.AFFINITY
    assert plugin.typed_name.type == "prefix-cache-scorer"
