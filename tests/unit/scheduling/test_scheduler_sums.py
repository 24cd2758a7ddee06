"""The engine's list-pass weighted sums equal its per-id sums bit for bit, whatever scorers
return: out-of-range, NaN, negative zero, missing ids, keys out of candidate order, a mapping
that is not a dict, and an odd or even number of scorers."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping

import pytest

from epp.scheduling.scheduler import ScorerResult, _sums_by_id, _weighted_sums


class Lazy(Mapping[str, float]):
    def __init__(self, values: dict[str, float]) -> None:
        self._values = values

    def __getitem__(self, key: str) -> float:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def _scores(rng: random.Random, ids: list[str], shape: int) -> Mapping[str, float]:
    specials = (math.nan, -0.0, -0.5, 1.5, math.inf, -math.inf, 0.0, 1.0)
    values = {i: rng.choice(specials) if rng.random() < 0.2 else rng.random() for i in ids}
    if shape == 1:  # some candidates left out
        values = {i: v for i, v in values.items() if rng.random() < 0.7}
    elif shape == 2:  # keyed out of candidate order
        keys = list(values)
        rng.shuffle(keys)
        values = {k: values[k] for k in keys}
    elif shape == 3:
        return Lazy(values)
    return values


@pytest.mark.parametrize("scorers", [1, 2, 3, 4, 5])
def test_list_sums_equal_per_id_sums_exactly(scorers: int) -> None:
    rng = random.Random(scorers)
    ids = [f"pod-{i}" for i in range(200)]
    for _ in range(20):
        results: list[ScorerResult] = [
            (f"s{k}", rng.choice((0.5, 1.0, 2.0, 3.0, 0.1)), _scores(rng, ids, rng.randrange(4)))
            for k in range(scorers)
        ]
        fast = _weighted_sums(ids, results)
        slow = _sums_by_id(ids, results, None)
        assert [repr(v) for v in fast] == [repr(slow[i]) for i in ids]


def test_no_scorers_sum_to_zero() -> None:
    assert _weighted_sums(["a", "b"], []) == [0.0, 0.0]
