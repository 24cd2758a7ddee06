"""Built-in pickers: turn a profile's scored candidates into targets in preference order.

All three share one parameter:

- ``maxNumOfEndpoints`` (int, default 1): how many targets to return; the first is the primary,
  the rest are fallbacks. Values <= 0 mean 1.

``max-score-picker``: shuffle, then stable-sort by score descending and take the top N, so ties
are broken at random rather than by candidate order.

``random-picker``: shuffle and take N; scores are ignored.

``weighted-random-picker``: weighted sampling without replacement (A-Res): each candidate draws
``U ~ Uniform(0, 1)`` and gets key ``U ** (1 / score)`` when ``score > 0``, else key 0; candidates
are sorted by key descending and the top N taken. A candidate is thus first with probability
proportional to its score. When no score is positive it behaves as ``random-picker``.

All randomness comes from ``CycleState.rng``, so a seeded cycle picks reproducibly.

YAML::

    plugins:
      - type: max-score-picker
        parameters:
          maxNumOfEndpoints: 2
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: max-score-picker
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import CycleState, PickResult, PluginBase, ScoredEndpoint

# A draw of exactly 0.0 would tie a positive-score candidate with the zero-score ones.
_MIN_DRAW = 1e-10


@dataclass(frozen=True)
class PickerParams:
    max_num_of_endpoints: int = 1

    def __post_init__(self) -> None:
        if self.max_num_of_endpoints <= 0:
            object.__setattr__(self, "max_num_of_endpoints", 1)


class _PickerBase(PluginBase):
    Params = PickerParams
    params: PickerParams

    def _result(
        self, ordered: Sequence[ScoredEndpoint], scored: Sequence[ScoredEndpoint]
    ) -> PickResult:
        top = ordered[: self.params.max_num_of_endpoints]
        return PickResult(targets=tuple(s.endpoint for s in top), scored=tuple(scored))


class MaxScorePicker(_PickerBase):
    TYPE: ClassVar[str] = "max-score-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        if self.params.max_num_of_endpoints == 1 and scored:
            # One target: a uniform choice among the best, without shuffling and sorting all.
            best = max(s.score for s in scored)
            ties = [s for s in scored if s.score == best]
            return PickResult((cycle.rng.choice(ties).endpoint,), tuple(scored))
        shuffled = _shuffled(cycle.rng, scored)
        shuffled.sort(key=lambda s: s.score, reverse=True)  # stable: ties keep shuffled order
        return self._result(shuffled, scored)


class RandomPicker(_PickerBase):
    TYPE: ClassVar[str] = "random-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        return self._result(_shuffled(cycle.rng, scored), scored)


class WeightedRandomPicker(_PickerBase):
    TYPE: ClassVar[str] = "weighted-random-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        shuffled = _shuffled(cycle.rng, scored)
        if not any(s.score > 0 for s in shuffled):
            return self._result(shuffled, scored)
        keyed = [(_ares_key(cycle.rng, s.score), s) for s in shuffled]
        keyed.sort(key=lambda pair: pair[0], reverse=True)
        return self._result([s for _, s in keyed], scored)


def _shuffled(rng: random.Random, scored: Sequence[ScoredEndpoint]) -> list[ScoredEndpoint]:
    items = list(scored)
    rng.shuffle(items)
    return items


def _ares_key(rng: random.Random, score: float) -> float:
    if score <= 0:
        return 0.0
    return float(max(rng.random(), _MIN_DRAW) ** (1.0 / score))
