"""What the built-in pickers share: the ``maxNumOfEndpoints`` parameter and a shuffle.

A picker turns a profile's scored candidates into targets in preference order; the first is the
primary, the rest are fallbacks. Every built-in picker takes one parameter:

- ``maxNumOfEndpoints`` (int, default 1): how many targets to return. Values <= 0 mean 1.

All randomness comes from ``CycleState.rng``, so a seeded cycle picks reproducibly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from epp.plugin import PickResult, PluginBase, ScoredCandidates, ScoredEndpoint


@dataclass(frozen=True)
class PickerParams:
    max_num_of_endpoints: int = 1

    def __post_init__(self) -> None:
        if self.max_num_of_endpoints <= 0:
            object.__setattr__(self, "max_num_of_endpoints", 1)


class PickerBase(PluginBase):
    Params = PickerParams
    params: PickerParams

    def _result(
        self, ordered: Sequence[ScoredEndpoint], scored: Sequence[ScoredEndpoint]
    ) -> PickResult:
        top = ordered[: self.params.max_num_of_endpoints]
        # the scheduler's ScoredCandidates is immutable: kept as it is, not copied item by item
        kept = scored if isinstance(scored, ScoredCandidates) else tuple(scored)
        return PickResult(targets=tuple(s.endpoint for s in top), scored=kept)


def shuffled(rng: random.Random, scored: Sequence[ScoredEndpoint]) -> list[ScoredEndpoint]:
    items = list(scored)
    rng.shuffle(items)
    return items
