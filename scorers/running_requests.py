"""``running-requests-size-scorer``: prefer endpoints running the fewest requests (Distribution).

Formula, over the candidates' ``metrics.running_requests_size`` ``r``::

    score = (max_r - r) / (max_r - min_r)        # 1.0 for every endpoint when all r are equal

An endpoint without metrics scores 0 and is left out of ``min_r``/``max_r`` (see ``queue-scorer``).

Parameters: none.

YAML::

    plugins:
      - type: running-requests-size-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: running-requests-size-scorer
            weight: 1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory
from scorers._minmax import lower_is_better


class RunningRequestsSizeScorer(PluginBase):
    TYPE: ClassVar[str] = "running-requests-size-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return lower_is_better(endpoints, lambda m: m.running_requests_size)
