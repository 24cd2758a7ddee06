"""``mm-embeddings-cache-scorer``: matched item size over total item size."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import EncoderCacheMatchInfo, MatchItem, ScorerCategory
from epp.plugin.params import decode
from epp.plugin.testing import check_plugin_class, check_scorer
from scorers.mm_embeddings_cache import MMEmbeddingsCacheScorer
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

POOL = [make_endpoint(i) for i in range(4)]
A, B, C = (MatchItem(h) for h in "abc")
KEY = "MultiModalEncoderCacheMatchInfoKey/mm-embeddings-cache-producer"


def scorer(**params: Any) -> MMEmbeddingsCacheScorer:
    decoded = decode(MMEmbeddingsCacheScorer.Params, params)
    return MMEmbeddingsCacheScorer(name="", params=decoded, handle=FakeHandle())


def with_infos(infos: dict[str, EncoderCacheMatchInfo], key: str = KEY) -> Any:
    return make_request(attributes={key: infos})


def test_scorer_honours_the_contract_and_reads_the_default_producer() -> None:
    check_plugin_class(MMEmbeddingsCacheScorer, "mm-embeddings-cache-scorer")
    s = scorer()
    assert s.category is ScorerCategory.AFFINITY
    assert s.consumes() == {KEY}
    infos = {POOL[0].id: EncoderCacheMatchInfo((A,), (A, B))}
    check_scorer(s, POOL, with_infos(infos))


def test_score_is_matched_fraction_of_request_items() -> None:
    request_items = (A, B, C)
    infos = {
        POOL[0].id: EncoderCacheMatchInfo((A, B, C), request_items),
        POOL[1].id: EncoderCacheMatchInfo((A,), request_items),
        POOL[2].id: EncoderCacheMatchInfo((), request_items),
    }
    got = scorer().score(make_cycle(), with_infos(infos), POOL)
    assert got == pytest.approx(
        {POOL[0].id: 1.0, POOL[1].id: 1 / 3, POOL[2].id: 0.0, POOL[3].id: 0.0}
    )


def test_item_sizes_weigh_the_score() -> None:
    big, small = MatchItem("big", size=3), MatchItem("small", size=1)
    infos = {POOL[0].id: EncoderCacheMatchInfo((big,), (big, small))}
    assert scorer().score(make_cycle(), with_infos(infos), POOL[:1]) == {POOL[0].id: 0.75}


def test_missing_attribute_or_empty_request_scores_zero() -> None:
    assert scorer().score(make_cycle(), make_request(), POOL[:2]) == dict.fromkeys(
        (e.id for e in POOL[:2]), 0.0
    )
    infos = {POOL[0].id: EncoderCacheMatchInfo((), ())}
    assert scorer().score(make_cycle(), with_infos(infos), POOL[:1]) == {POOL[0].id: 0.0}


def test_producer_name_selects_whose_match_info_is_read() -> None:
    key = "MultiModalEncoderCacheMatchInfoKey/mine"
    s = scorer(producerName="mine")
    assert s.consumes() == {key}
    infos = {POOL[0].id: EncoderCacheMatchInfo((A,), (A,))}
    assert s.score(make_cycle(), with_infos(infos, key), POOL[:1]) == {POOL[0].id: 1.0}
    assert scorer().score(make_cycle(), with_infos(infos, key), POOL[:1]) == {POOL[0].id: 0.0}
