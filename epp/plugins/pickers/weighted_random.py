"""``weighted-random-picker``: weighted sampling without replacement (A-Res).

Each candidate draws ``U ~ Uniform(0, 1)`` and gets key ``U ** (1 / score)`` when ``score > 0``,
else key 0; candidates are sorted by key descending and the top ``maxNumOfEndpoints`` taken. A
candidate is thus first with probability proportional to its score. When no score is positive it
behaves as ``random-picker``.

YAML::

    plugins:
      - type: weighted-random-picker
        parameters:
          maxNumOfEndpoints: 2
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from epp.plugin import CycleState, PickResult, ScoredEndpoint
from epp.plugins.pickers.common import PickerBase, shuffled

# A draw of exactly 0.0 would tie a positive-score candidate with the zero-score ones.
_MIN_DRAW = 1e-10


class WeightedRandomPicker(PickerBase):
    TYPE: ClassVar[str] = "weighted-random-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        ordered = shuffled(cycle.rng, scored)
        if not any(s.score > 0 for s in ordered):
            return self._result(ordered, scored)
        keyed = [(_ares_key(cycle.rng, s.score), s) for s in ordered]
        keyed.sort(key=lambda pair: pair[0], reverse=True)
        return self._result([s for _, s in keyed], scored)


def _ares_key(rng: random.Random, score: float) -> float:
    if score <= 0:
        return 0.0
    return float(max(rng.random(), _MIN_DRAW) ** (1.0 / score))
