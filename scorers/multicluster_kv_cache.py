"""``multicluster-kv-cache-utilization-scorer`` (alpha): prefer the cluster with the most free
KV cache (category Distribution), for a cluster-scoped EPP whose candidates are clusters
(``epp.plugins.sources.multicluster``).

Formula, with ``u`` the cluster's aggregate KV-cache utilization
(``MultiClusterKVCacheUtilization/multicluster-metrics-extractor``: its pool's average, as its
own EPP exports it)::

    score = 1 - u                                # clamped to [0, 1]

A cluster without the attribute (not scraped yet, or its page lacks the metric) scores 0.
The attribute comes only from ``multicluster-metrics-extractor``: a config without it under
``dataLayer.sources`` stops at startup (``AttributeNeeds``), as upstream's.

Parameters: none.

YAML::

    plugins:
    - type: multicluster-kv-cache-utilization-scorer
      name: kv-cache
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: kv-cache
        weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import (
    MULTICLUSTER_KV_CACHE_UTILIZATION,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
    endpoint_attribute,
)


class MultiClusterKVCacheUtilizationScorer(PluginBase):
    TYPE: ClassVar[str] = "multicluster-kv-cache-utilization-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def required_attributes(self) -> frozenset[str]:
        return frozenset({MULTICLUSTER_KV_CACHE_UTILIZATION})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        scores = {}
        for endpoint in endpoints:
            used = endpoint_attribute(endpoint, MULTICLUSTER_KV_CACHE_UTILIZATION)
            scores[endpoint.id] = 0.0 if used is None else min(1.0, max(0.0, 1.0 - used))
        return scores
