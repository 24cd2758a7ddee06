"""``lora-affinity-scorer``: prefer endpoints that have the request's LoRA adapter (Affinity).

For ``m = request.target_model`` and the endpoint's ``active_models`` / ``waiting_models`` /
``max_active_models``::

    m in active_models                                   -> 1.0
    len(active) + len(waiting) < max_active_models       -> 0.8   (a free adapter slot)
    m in waiting_models                                  -> 0.6   (being loaded, no free slot)
    otherwise                                            -> 0.0

An endpoint without metrics scores 0.

Parameters: none.

YAML::

    plugins:
      - type: lora-affinity-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: lora-affinity-scorer
            weight: 1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory

_ACTIVE = 1.0
_FREE_SLOT = 0.8
_WAITING = 0.6


class LoraAffinityScorer(PluginBase):
    TYPE: ClassVar[str] = "lora-affinity-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return {ep.id: _affinity(ep, request.target_model) for ep in endpoints}


def _affinity(endpoint: Endpoint, model: str) -> float:
    metrics = endpoint.metrics
    if metrics is None:
        return 0.0
    if model in metrics.active_models:
        return _ACTIVE
    if len(metrics.active_models) + len(metrics.waiting_models) < metrics.max_active_models:
        return _FREE_SLOT
    if model in metrics.waiting_models:
        return _WAITING
    return 0.0
