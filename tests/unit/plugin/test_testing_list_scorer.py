"""The contract kit checks a ``ListScorer``'s two forms against each other: ``score_list`` must
give each candidate, in order, exactly what ``score`` gives it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import pytest

from epp.plugin import Endpoint, ListScorer, PluginBase, ScorerCategory
from epp.plugin.testing import check_score_list, check_scorer, sample_endpoints


class Agreeing(PluginBase):
    TYPE: ClassVar[str] = "agreeing-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        return [(i % 4) / 4 for i in range(len(endpoints))]

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> Mapping[str, float]:
        scores = self.score_list(cycle, request, endpoints)
        return {e.id: s for e, s in zip(endpoints, scores, strict=True)}


class Reversed(Agreeing):
    """The list in the reverse of candidate order: every value there, none at its place."""

    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        return super().score_list(cycle, request, endpoints)[::-1]

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> Mapping[str, float]:
        scores = super().score_list(cycle, request, endpoints)
        return {e.id: s for e, s in zip(endpoints, scores, strict=True)}


class Short(Reversed):
    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        return Agreeing.score_list(self, cycle, request, endpoints)[1:]


class LeavesOut(Agreeing):
    """``score`` leaves the first endpoint out (it counts 0), ``score_list`` says 0.75 there."""

    def score_list(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> list[float]:
        return [0.75] + [0.0] * (len(endpoints) - 1) if endpoints else []

    def score(self, cycle: Any, request: Any, endpoints: Sequence[Endpoint]) -> Mapping[str, float]:
        return {e.id: 0.0 for e in endpoints[1:]}


def test_a_scorer_whose_forms_agree_passes() -> None:
    scorer = Agreeing(name="s", params=None, handle=None)
    assert isinstance(scorer, ListScorer)
    for n in (0, 1, 7):
        check_scorer(scorer, sample_endpoints(n))


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (Reversed, r"score_list\(\) gives .* score\(\) gives it"),
        (Short, r"returned 6 scores for 7 endpoints"),
        (LeavesOut, r"score_list\(\) gives .* 0.75, score\(\) gives it 0.0"),
    ],
)
def test_forms_that_disagree_fail(cls: type[Agreeing], message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_score_list(cls(name="s", params=None, handle=None), sample_endpoints(7))


def test_check_scorer_runs_the_list_check() -> None:
    with pytest.raises(AssertionError, match="score_list"):
        check_scorer(Reversed(name="s", params=None, handle=None), sample_endpoints(7))
