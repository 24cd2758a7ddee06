"""``queue-scorer``: prefer endpoints with the shortest waiting queue (category Distribution).

Formula, over the candidates' ``metrics.waiting_queue_size`` ``q``::

    score = (max_q - q) / (max_q - min_q)        # 1.0 for every endpoint when all q are equal

An endpoint without metrics (never scraped) scores 0 and is left out of ``min_q``/``max_q``, so it
is never preferred and does not distort the others' scores. Metrics are used as last scraped;
staleness is the saturation detector's concern, not the scorer's.

Parameters: none.

YAML::

    plugins:
      - type: queue-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: queue-scorer
            weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory
from scorers._minmax import lower_is_better


class QueueScorer(PluginBase):
    TYPE: ClassVar[str] = "queue-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return lower_is_better(endpoints, lambda m: m.waiting_queue_size)
