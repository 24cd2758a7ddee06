"""``load-aware-scorer``: score the waiting queue against a fixed threshold (Distribution).

Formula, with ``q = metrics.waiting_queue_size`` and ``T = threshold``::

    q == 0      -> 0.5
    q >= T      -> 0.0
    otherwise   -> 0.5 * (1 - q / T)

The score tops out at 0.5, so an idle endpoint gains half the scorer's weight. An endpoint without
metrics scores 0.

Parameters:

- ``threshold`` (int, default 128, > 0): queue length at which the score reaches 0.

YAML::

    plugins:
      - type: load-aware-scorer
        parameters:
          threshold: 64
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory

_IDLE_SCORE = 0.5


class LoadAwareScorer(PluginBase):
    TYPE: ClassVar[str] = "load-aware-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        threshold: int = 128

        def __post_init__(self) -> None:
            if self.threshold <= 0:
                raise ValueError(f"threshold must be > 0, got {self.threshold}")

    params: Params

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return {ep.id: self._score_one(ep) for ep in endpoints}

    def _score_one(self, endpoint: Endpoint) -> float:
        if endpoint.metrics is None:
            return 0.0
        queue = endpoint.metrics.waiting_queue_size
        threshold = self.params.threshold
        if queue <= 0:
            return _IDLE_SCORE
        if queue >= threshold:
            return 0.0
        return _IDLE_SCORE * (1.0 - queue / threshold)
