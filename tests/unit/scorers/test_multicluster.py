"""The multicluster scorers: ``multicluster-kv-cache-utilization-scorer`` (1 - the cluster's
aggregate KV use) and ``multicluster-queue-scorer`` (min-max over the clusters' aggregate queues)
read the attributes ``multicluster-metrics-extractor`` publishes and declare them needed;
``multicluster-prefix-cache-scorer`` is ``prefix-cache-scorer`` under its own type, and with a
``multicluster-approx-prefix-cache-producer`` sends a repeated prompt back to its cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import (
    MULTICLUSTER_KV_CACHE_UTILIZATION,
    MULTICLUSTER_QUEUE_SIZE,
    AttributeNeeds,
    Endpoint,
    Metrics,
    ProfileResult,
    SchedulingResult,
    ScorerCategory,
    Stability,
    TokenizedPrompt,
    with_attribute,
)
from epp.plugin.params import decode
from epp.plugin.testing import check_plugin_class, check_producer, check_scorer
from epp.plugins.producers.multicluster_approx_prefix import (
    MultiClusterApproxPrefixCacheProducer,
)
from scorers.multicluster_kv_cache import MultiClusterKVCacheUtilizationScorer
from scorers.multicluster_prefix_cache import MultiClusterPrefixCacheScorer
from scorers.multicluster_queue import MultiClusterQueueScorer
from scorers.prefix_cache import PrefixCacheScorer
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request


def cluster(i: int, *, kv: float | None = None, queue: float | None = None) -> Endpoint:
    metrics = Metrics()
    metrics = with_attribute(metrics, MULTICLUSTER_KV_CACHE_UTILIZATION, kv)
    metrics = with_attribute(metrics, MULTICLUSTER_QUEUE_SIZE, queue)
    return dataclasses.replace(make_endpoint(i), metrics=metrics)


def scores(scorer: Any, endpoints: list[Endpoint]) -> list[float]:
    out = scorer.score(make_cycle(), make_request(), endpoints)
    return [out[e.id] for e in endpoints]


def build(cls: Any, **params: Any) -> Any:
    return cls(name="", params=decode(cls.Params, params), handle=FakeHandle())


def test_kv_cache_scores_the_free_share_of_each_clusters_cache() -> None:
    check_plugin_class(
        MultiClusterKVCacheUtilizationScorer, "multicluster-kv-cache-utilization-scorer"
    )
    s = build(MultiClusterKVCacheUtilizationScorer)
    clusters = [cluster(0, kv=0.2), cluster(1, kv=0.75), cluster(2), cluster(3, kv=1.5)]
    assert scores(s, clusters) == pytest.approx([0.8, 0.25, 0.0, 0.0])
    check_scorer(s, clusters)
    assert s.required_attributes() == {MULTICLUSTER_KV_CACHE_UTILIZATION}


def test_queue_normalises_the_clusters_queues_and_leaves_unknown_ones_out() -> None:
    check_plugin_class(MultiClusterQueueScorer, "multicluster-queue-scorer")
    s = build(MultiClusterQueueScorer)
    clusters = [cluster(0, queue=2.0), cluster(1, queue=6.0), cluster(2), cluster(3, queue=3.0)]
    assert scores(s, clusters) == pytest.approx([1.0, 0.0, 0.0, 0.75])
    assert scores(s, [cluster(0, queue=4.0), cluster(1, queue=4.0)]) == [1.0, 1.0]
    assert scores(s, [cluster(0), cluster(1)]) == [0.0, 0.0]
    check_scorer(s, clusters)
    assert s.required_attributes() == {MULTICLUSTER_QUEUE_SIZE}


def test_the_metric_scorers_declare_what_they_need() -> None:
    for cls in (MultiClusterKVCacheUtilizationScorer, MultiClusterQueueScorer):
        assert cls.STABILITY is Stability.ALPHA
        assert cls.category is ScorerCategory.DISTRIBUTION
        assert isinstance(build(cls), AttributeNeeds)


async def test_a_repeated_prompt_goes_back_to_the_cluster_that_served_it() -> None:
    check_plugin_class(MultiClusterPrefixCacheScorer, "multicluster-prefix-cache-scorer")
    check_plugin_class(
        MultiClusterApproxPrefixCacheProducer, "multicluster-approx-prefix-cache-producer"
    )
    producer = build(MultiClusterApproxPrefixCacheProducer, autoTune=False, blockSizeTokens=16)
    scorer = build(
        MultiClusterPrefixCacheScorer,
        prefixMatchInfoProducerName="multicluster-approx-prefix-cache-producer",
    )
    assert isinstance(scorer, PrefixCacheScorer) and scorer.STABILITY is Stability.ALPHA
    assert scorer.consumes() == producer.produces()
    clusters = [cluster(i) for i in range(3)]
    prompt = TokenizedPrompt.from_token_ids([list(range(160))])

    def request() -> Any:
        return make_request(target_model="m", attributes={"TokenizedPrompt/token-producer": prompt})

    first = request()
    await check_producer(producer, first, clusters)
    producer.pre_request(first, SchedulingResult({"d": ProfileResult(targets=(clusters[2],))}, "d"))
    second = request()
    await producer.produce(second, clusters)
    assert scorer.score(make_cycle(), second, clusters) == {
        clusters[0].id: 0.0,
        clusters[1].id: 0.0,
        clusters[2].id: 1.0,
    }
