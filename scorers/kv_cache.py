"""``kv-cache-utilization-scorer``: prefer endpoints with free KV-cache (category Distribution).

Formula, with ``kv = metrics.kv_cache_usage_percent`` (a fraction in [0, 1])::

    score = 1 - kv                               # clamped to [0, 1]

An endpoint without metrics scores 0: an unknown cache must not look empty.

Parameters: none.

YAML::

    plugins:
      - type: kv-cache-utilization-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: kv-cache-utilization-scorer
            weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory


class KVCacheUtilizationScorer(PluginBase):
    TYPE: ClassVar[str] = "kv-cache-utilization-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return {ep.id: _free_fraction(ep) for ep in endpoints}


def _free_fraction(endpoint: Endpoint) -> float:
    if endpoint.metrics is None:
        return 0.0
    return min(1.0, max(0.0, 1.0 - endpoint.metrics.kv_cache_usage_percent))
