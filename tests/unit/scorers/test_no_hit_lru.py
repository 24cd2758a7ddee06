from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import (
    Consumer,
    Endpoint,
    PrefixMatchInfo,
    PreRequest,
    ProfileResult,
    SchedulingResult,
    Scorer,
    ScorerCategory,
)
from epp.plugin.params import ParamError, decode
from scorers.no_hit_lru import NoHitLRUScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request

KEY = "PrefixCacheMatchInfo/approx-prefix-cache-producer"


def _scorer(**params: Any) -> NoHitLRUScorer:
    return NoHitLRUScorer(name="", params=decode(NoHitLRUScorer.Params, params), handle=handle())


def _cold(endpoints: list[Endpoint]) -> Any:
    return make_request(attributes={KEY: {ep.id: PrefixMatchInfo(0, 4, 64) for ep in endpoints}})


def _result(target: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"decode": ProfileResult(targets=(target,))}
    if prefill is not None:
        results["prefill"] = ProfileResult(targets=(prefill,))
    return SchedulingResult(profile_results=results, primary_profile="decode")


def _scores(scorer: NoHitLRUScorer, request: Any, endpoints: list[Endpoint]) -> list[float]:
    scores = scorer.score(make_cycle(), request, endpoints)
    return [scores[ep.id] for ep in endpoints]


def test_score_is_neutral_when_any_endpoint_has_a_hit() -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    infos = {ep.id: PrefixMatchInfo(0, 4, 64) for ep in endpoints}
    infos[endpoints[2].id] = PrefixMatchInfo(1, 4, 64)
    request = make_request(attributes={KEY: infos})
    assert _scores(_scorer(), request, endpoints) == [0.5, 0.5, 0.5]


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        pytest.param(1, [1.0], id="single"),
        pytest.param(2, [1.0, 0.0], id="two"),
        pytest.param(3, [1.0, 0.5, 0.0], id="three"),
        pytest.param(5, [1.0, 0.75, 0.5, 0.25, 0.0], id="five"),
    ],
)
def test_score_ranks_never_used_in_order_when_request_cold(n: int, expected: list[float]) -> None:
    endpoints = [make_endpoint(i) for i in range(n)]
    assert _scores(_scorer(), _cold(endpoints), endpoints) == pytest.approx(expected)


@pytest.mark.parametrize(
    "request_attributes",
    [pytest.param({}, id="no-attribute"), pytest.param({KEY: {}}, id="empty-attribute")],
)
def test_score_treats_request_as_cold_when_match_info_missing(
    request_attributes: dict[str, Any],
) -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    request = make_request(attributes=request_attributes)
    assert _scores(_scorer(), request, endpoints) == [1.0, 0.5, 0.0]


def test_score_puts_recently_used_last_when_cold_requests_were_routed() -> None:
    scorer = _scorer()
    endpoints = [make_endpoint(i) for i in range(3)]
    scorer.pre_request(_cold(endpoints), _result(endpoints[0]))
    assert _scores(scorer, _cold(endpoints), endpoints) == [0.0, 1.0, 0.5]
    scorer.pre_request(_cold(endpoints), _result(endpoints[1]))
    # never used: pod-2 (1.0); then pod-0 (LRU position 0) and pod-1 (position 1)
    assert _scores(scorer, _cold(endpoints), endpoints) == [0.5, 0.0, 1.0]


def test_score_clamps_to_zero_when_lru_holds_non_candidates() -> None:
    scorer = _scorer()
    pool = [make_endpoint(i) for i in range(4)]
    for ep in pool:
        scorer.pre_request(_cold(pool), _result(ep))
    candidates = [pool[0], pool[3]]
    # ranks 0 and 3 over N - 1 = 1
    assert _scores(scorer, _cold(candidates), candidates) == [1.0, 0.0]


def test_pre_request_ignores_warm_request_when_scheduled() -> None:
    scorer = _scorer()
    endpoints = [make_endpoint(i) for i in range(2)]
    warm = make_request(attributes={KEY: {endpoints[1].id: PrefixMatchInfo(2, 4, 64)}})
    scorer.pre_request(warm, _result(endpoints[0]))
    assert scorer.dump_state()["leastRecentlyUsedFirst"] == []


def test_pre_request_records_prefill_target_when_prefill_profile_present() -> None:
    scorer = _scorer()
    endpoints = [make_endpoint(i) for i in range(3)]
    scorer.pre_request(_cold(endpoints), _result(endpoints[2], prefill=endpoints[0]))
    assert scorer.dump_state()["leastRecentlyUsedFirst"] == [endpoints[2].id, endpoints[0].id]


def test_lru_forgets_oldest_when_size_exceeded() -> None:
    scorer = _scorer(lruSize=2)
    endpoints = [make_endpoint(i) for i in range(3)]
    for ep in endpoints:
        scorer.pre_request(_cold(endpoints), _result(ep))
    assert scorer.dump_state()["leastRecentlyUsedFirst"] == [endpoints[1].id, endpoints[2].id]
    assert _scores(scorer, _cold(endpoints), endpoints) == [1.0, 0.5, 0.0]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        pytest.param({}, KEY, id="default-producer"),
        pytest.param({"prefixMatchInfoProducerName": ""}, KEY, id="empty-means-default"),
        pytest.param(
            {"prefixMatchInfoProducerName": "precise"},
            "PrefixCacheMatchInfo/precise",
            id="custom-producer",
        ),
        pytest.param(
            {"prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "p"},
            KEY,
            id="deprecated-params-ignored",
        ),
    ],
)
def test_consumes_producer_key_when_configured(params: dict[str, Any], key: str) -> None:
    scorer = _scorer(**params)
    assert isinstance(scorer, Scorer)
    assert isinstance(scorer, PreRequest)
    assert isinstance(scorer, Consumer)
    assert scorer.category is ScorerCategory.DISTRIBUTION
    assert scorer.consumes() == frozenset({key})


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param({"lruSize": -1}, "lruSize must be >= 0, got \\-1", id="negative-size"),
        pytest.param(
            {"lruSize": "big"}, "lruSize: expected an integer, got 'big'", id="wrong-type"
        ),
        pytest.param(
            {"other": 1}, "other: unknown field \\(known: lruSize, pr", id="unknown-field"
        ),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(NoHitLRUScorer.Params, params)


def _reference(lru: list[str], infos: dict[str, PrefixMatchInfo], ids: list[str]) -> list[float]:
    """The module docstring's formula, written out plainly."""
    n = len(ids)
    if any(infos.get(i, PrefixMatchInfo(0, 0, 0)).match_blocks > 0 for i in ids):
        return [0.5] * n
    if n == 1:
        return [1.0]
    unused = [i for i in ids if i not in lru]
    out = []
    for i in ids:
        if i in unused:
            out.append(1.0 - unused.index(i) / (n - 1))
        else:
            out.append(max(0.0, 1.0 - (len(unused) + lru.index(i)) / (n - 1)))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_cold_scores_follow_the_formula_for_any_lru_state_and_candidate_subset(seed: int) -> None:
    import random

    rng = random.Random(seed)
    pool = [make_endpoint(i) for i in range(rng.randint(1, 30))]
    scorer = _scorer(lruSize=rng.choice([0, 5, 64]))
    for _ in range(rng.randint(0, 60)):  # cold requests routed to random endpoints
        target = rng.choice(pool)
        scorer.pre_request(_cold(pool), _result(target))
    candidates = rng.sample(pool, rng.randint(1, len(pool)))
    infos = {ep.id: PrefixMatchInfo(rng.choice([0, 0, 0, -1]), 4, 64) for ep in pool}
    if rng.random() < 0.3:  # a hit on an endpoint that is not a candidate keeps it cold
        outsider = [ep for ep in pool if ep not in candidates]
        if outsider:
            infos[outsider[0].id] = PrefixMatchInfo(3, 4, 64)
    if rng.random() < 0.2:  # a hit on a candidate makes it warm
        infos[candidates[-1].id] = PrefixMatchInfo(2, 4, 64)
    request = make_request(attributes={KEY: infos})
    lru = list(scorer.dump_state()["leastRecentlyUsedFirst"])
    ids = [ep.id for ep in candidates]
    assert scorer.score_list(make_cycle(), request, candidates) == _reference(lru, infos, ids)
    assert _scores(scorer, request, candidates) == _reference(lru, infos, ids)


def test_negative_match_blocks_count_as_no_hit() -> None:
    endpoints = [make_endpoint(i) for i in range(3)]
    infos = {ep.id: PrefixMatchInfo(-2, 4, 64) for ep in endpoints}
    request = make_request(attributes={KEY: infos})
    assert _scores(_scorer(), request, endpoints) == [1.0, 0.5, 0.0]
    scorer = _scorer()
    scorer.pre_request(request, _result(endpoints[1]))  # cold: recorded
    assert scorer.dump_state()["leastRecentlyUsedFirst"] == [endpoints[1].id]
