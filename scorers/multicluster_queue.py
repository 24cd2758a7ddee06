"""``multicluster-queue-scorer`` (alpha): prefer the cluster with the shortest queue (category
Distribution), for a cluster-scoped EPP whose candidates are clusters
(``epp.plugins.sources.multicluster``).

Formula, over the candidates' aggregate queue ``q``
(``MultiClusterQueueSize/multicluster-metrics-extractor``: each cluster's average waiting queue,
as its own EPP exports it)::

    score = (max_q - q) / (max_q - min_q)        # 1.0 for every cluster when all q are equal

A cluster without the attribute scores 0 and is left out of ``min_q``/``max_q``. The attribute
comes only from ``multicluster-metrics-extractor``: a config without it under
``dataLayer.sources`` stops at startup (``AttributeNeeds``), as upstream's.

Parameters: none.

YAML::

    plugins:
    - type: multicluster-queue-scorer
      name: queue
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: queue
        weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import (
    MULTICLUSTER_QUEUE_SIZE,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
    endpoint_attribute,
)


class MultiClusterQueueScorer(PluginBase):
    TYPE: ClassVar[str] = "multicluster-queue-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def required_attributes(self) -> frozenset[str]:
        return frozenset({MULTICLUSTER_QUEUE_SIZE})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        queues = {
            e.id: q
            for e in endpoints
            if (q := endpoint_attribute(e, MULTICLUSTER_QUEUE_SIZE)) is not None
        }
        scores = dict.fromkeys((e.id for e in endpoints), 0.0)
        if not queues:
            return scores
        low, high = min(queues.values()), max(queues.values())
        for endpoint_id, q in queues.items():
            scores[endpoint_id] = 1.0 if high == low else (high - q) / (high - low)
        return scores
