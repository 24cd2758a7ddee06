from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import NoParams, Scorer, ScorerCategory
from scorers.running_requests import RunningRequestsSizeScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _scorer() -> RunningRequestsSizeScorer:
    return RunningRequestsSizeScorer(name="rr", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        pytest.param([0, 2, 8], [1.0, 0.75, 0.0], id="spread"),
        pytest.param([5, 5, 5], [1.0, 1.0, 1.0], id="all-equal"),
        pytest.param([0], [1.0], id="single"),
    ],
)
def test_score_is_min_max_of_running_when_metrics_present(
    running: list[int], expected: list[float]
) -> None:
    endpoints = [make_endpoint(i, running=r) for i, r in enumerate(running)]
    scores = _scorer().score(make_cycle(), make_request(), endpoints)
    assert [scores[ep.id] for ep in endpoints] == pytest.approx(expected)


def test_score_is_zero_and_outside_range_when_metrics_missing() -> None:
    endpoints = [
        make_endpoint(0, running=1),
        make_endpoint(1, running=3),
        dataclasses.replace(make_endpoint(2), metrics=None),
    ]
    scores = _scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 1.0, endpoints[1].id: 0.0, endpoints[2].id: 0.0}


def test_plugin_is_distribution_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.DISTRIBUTION
    assert plugin.typed_name.type == "running-requests-size-scorer"
    assert plugin.typed_name.name == "rr"
