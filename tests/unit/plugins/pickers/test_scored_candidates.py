"""Every built-in picker picks the same targets, with the same random draws, from the scheduler's
``ScoredCandidates`` as from a list of the same ``ScoredEndpoint``s; and ``ScoredCandidates``
is that list as a sequence."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.plugin import ScoredCandidates, ScoredEndpoint
from epp.plugin.params import decode
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.pickers.random_picker import RandomPicker
from epp.plugins.pickers.weighted_random import WeightedRandomPicker
from tests.builders import handle, make_cycle, make_endpoint


@pytest.mark.parametrize("cls", [MaxScorePicker, RandomPicker, WeightedRandomPicker])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_pickers_pick_alike_from_scored_candidates(cls: Any, n: int) -> None:
    picker = cls(name="", params=decode(cls.Params, {"maxNumOfEndpoints": n}), handle=handle())
    rng = random.Random(n)
    eps = [make_endpoint(i) for i in range(40)]
    for seed in range(30):
        scores = [rng.choice((0.0, 0.5, 1.5, 2.0)) for _ in eps]  # many ties
        as_list = [ScoredEndpoint(e, s) for e, s in zip(eps, scores, strict=True)]
        lazy = ScoredCandidates(eps, scores)
        cycle_a, cycle_b = make_cycle(seed), make_cycle(seed)
        a, b = picker.pick(cycle_a, as_list), picker.pick(cycle_b, lazy)
        assert a.targets == b.targets
        assert list(a.scored) == list(b.scored) == as_list
        assert cycle_a.rng.random() == cycle_b.rng.random()  # the same draws were made


def test_scored_candidates_is_a_sequence_of_scored_endpoints() -> None:
    eps = [make_endpoint(i) for i in range(5)]
    scores = [0.5, 1.0, 0.0, 2.5, 0.25]
    lazy = ScoredCandidates(eps, scores)
    want = [ScoredEndpoint(e, s) for e, s in zip(eps, scores, strict=True)]
    assert len(lazy) == 5 and list(lazy) == want
    assert [lazy[i] for i in range(-5, 5)] == want + want
    assert type(lazy[0]) is ScoredEndpoint and lazy[3].score == 2.5
    assert list(lazy[1:4]) == want[1:4] and list(lazy[::-1]) == want[::-1]
    assert lazy.index(want[2]) == 2 and want[4] in lazy
    with pytest.raises(IndexError):
        lazy[5]
    with pytest.raises(ValueError, match="5 endpoints but 4 scores"):
        ScoredCandidates(eps, scores[:4])
