"""A scorer's list form (``ListScorer``) and its mapping form schedule identically: the same
totals bit for bit, the same explain view and the same picks, whatever the scores (out of range,
NaN, negative zero, left out), on small pools (the explain path) and large ones (the list
path), with duplicate ids, and mixed with scorers that offer only the mapping. A list of the
wrong length is a failing scorer."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from epp.observability.decisions import EXPLAIN_KEY
from epp.plugin import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ListScorer,
    PluginBase,
    Profile,
    ScorerCategory,
)
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.profiles.single import SingleProfileHandler
from epp.scheduling.scheduler import Scheduler
from tests.builders import make_endpoint, make_request

SPECIALS = (math.nan, -0.0, -0.5, 1.5, math.inf, -math.inf, 0.0, 1.0, 0.25)


class MappingScorer(PluginBase):
    """Scores from a table (by id), seeded; ids missing from the table are left out."""

    TYPE: ClassVar[str] = "table-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str, table: Mapping[str, float]) -> None:
        super().__init__(name=name, params=None, handle=None)
        self.table = table

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> Mapping[str, float]:
        return {e.id: self.table[e.id] for e in endpoints if e.id in self.table}


class ListedScorer(MappingScorer):
    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        return [self.table.get(e.id, 0.0) for e in endpoints]


class WrongLength(MappingScorer):
    calls = 0

    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        self.calls += 1
        return [1.0] * (len(endpoints) + 1)


def _table(rng: random.Random, eps: Sequence[Endpoint]) -> dict[str, float]:
    # coarse values, so ties happen and the seeded tie-break is exercised
    table = {
        e.id: rng.choice(SPECIALS) if rng.random() < 0.3 else rng.choice((0.1, 0.5, 0.9))
        for e in eps
    }
    return {k: v for k, v in table.items() if rng.random() < 0.9}  # some left out


def _run(
    scorers: list[tuple[MappingScorer, float]], eps: Sequence[Endpoint], seed: int
) -> tuple[Any, ...]:
    errors: list[str] = []
    picker = MaxScorePicker(name="p", params=MaxScorePicker.Params(), handle=None)
    profile = Profile("default", (), tuple(scorers), picker)  # type: ignore[arg-type]
    scheduler = Scheduler(
        profiles={"default": profile},
        handler=SingleProfileHandler(name="h", params=None, handle=None),
        observe=lambda *_: None,
        count_error=lambda *a: errors.append(a[2]),
    )
    request: InferenceRequest = make_request()
    result = scheduler.schedule(CycleState(0.0, random.Random(seed)), request, eps)
    primary = result.primary
    totals = [(k, repr(v)) for k, v in primary.scores.items()]
    return [e.id for e in primary.targets], totals, request.attributes.get(EXPLAIN_KEY), errors


@pytest.mark.parametrize("n", [1, 10, 64, 65, 300])
def test_list_and_mapping_forms_schedule_identically(n: int) -> None:
    rng = random.Random(n)
    eps = [make_endpoint(i) for i in range(n)]
    for trial in range(12):
        count = rng.randrange(1, 7)
        tables = [_table(rng, eps) for _ in range(count)]
        weights = [rng.choice((0.5, 1.0, 2.0, 3.0, 0.1)) for _ in range(count)]
        listed = [rng.random() < 0.7 for _ in range(count)]
        mapped = [
            (MappingScorer(f"s{k}", t), w)
            for k, (t, w) in enumerate(zip(tables, weights, strict=True))
        ]
        mixed = [
            ((ListedScorer if lst else MappingScorer)(f"s{k}", t), w)
            for k, (t, w, lst) in enumerate(zip(tables, weights, listed, strict=True))
        ]
        assert any(isinstance(s, ListScorer) for s, _ in mixed) == any(listed)
        want = _run(mapped, eps, trial)  # type: ignore[arg-type]
        assert _run(mixed, eps, trial) == want  # type: ignore[arg-type]


def test_duplicate_ids_schedule_identically() -> None:
    rng = random.Random(9)
    eps = [make_endpoint(i % 70) for i in range(140)]
    tables = [_table(rng, eps) for _ in range(3)]
    mapped = [(MappingScorer(f"s{k}", t), 1.0 + k) for k, t in enumerate(tables)]
    listed = [(ListedScorer(f"s{k}", t), 1.0 + k) for k, t in enumerate(tables)]
    assert _run(listed, eps, 1) == _run(mapped, eps, 1)  # type: ignore[arg-type]


def test_a_list_of_the_wrong_length_is_a_failing_scorer() -> None:
    rng = random.Random(2)
    eps = [make_endpoint(i) for i in range(100)]
    table = _table(rng, eps)
    wrong = WrongLength("bad", table)
    targets, totals, _, errors = _run([(ListedScorer("s0", table), 1.0), (wrong, 5.0)], eps, 3)  # type: ignore[list-item]
    assert wrong.calls == 1 and errors == ["bad"]
    alone = _run([(ListedScorer("s0", table), 1.0)], eps, 3)  # type: ignore[list-item]
    assert (targets, totals) == alone[:2]  # it contributed 0
