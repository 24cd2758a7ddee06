"""``random-picker``: shuffle the candidates and take ``maxNumOfEndpoints``; scores are ignored.

YAML::

    plugins:
      - type: random-picker
        parameters:
          maxNumOfEndpoints: 1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.plugin import CycleState, PickResult, ScoredEndpoint
from epp.plugins.pickers.common import PickerBase, shuffled


class RandomPicker(PickerBase):
    TYPE: ClassVar[str] = "random-picker"

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        return self._result(shuffled(cycle.rng, scored), scored)
