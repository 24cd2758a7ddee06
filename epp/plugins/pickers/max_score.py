"""``max-score-picker``: the highest total score wins; ties are broken at random.

With ``maxNumOfEndpoints`` N > 1: shuffle, then stable-sort by score descending and take the top
N, so ties are broken at random rather than by candidate order. With N = 1 (the default) it picks
uniformly among the best without sorting everything (O(n)), reading the scheduler's
``ScoredCandidates.scores`` directly (no ``ScoredEndpoint`` is built). See ``common`` for the
parameter.

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

from collections.abc import Sequence
from itertools import compress, repeat
from operator import attrgetter, eq
from typing import ClassVar

from epp.plugin import CycleState, PickResult, ScoredCandidates, ScoredEndpoint
from epp.plugins.pickers.common import PickerBase, shuffled

_score = attrgetter("score")


class MaxScorePicker(PickerBase):
    TYPE: ClassVar[str] = "max-score-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        if self.params.max_num_of_endpoints == 1 and scored:
            # One target: a uniform choice among the best, without shuffling and sorting all.
            if isinstance(scored, ScoredCandidates):
                scores = scored.scores
                best = max(scores)
                ties = list(compress(scored.endpoints, map(eq, scores, repeat(best))))
                return PickResult((cycle.rng.choice(ties),), scored)
            scores = list(map(_score, scored))
            best = max(scores)
            tied = list(compress(scored, map(eq, scores, repeat(best))))
            return PickResult((cycle.rng.choice(tied).endpoint,), tuple(scored))
        ordered = shuffled(cycle.rng, scored)
        ordered.sort(key=lambda s: s.score, reverse=True)  # stable: ties keep shuffled order
        return self._result(ordered, scored)
