from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import NoParams, Scorer, ScorerCategory, TypedName
from epp.plugin.params import ParamError, decode
from scorers.queue import QueueScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _queue_scorer() -> QueueScorer:
    return QueueScorer(name="", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        pytest.param([0, 5, 10], [1.0, 0.5, 0.0], id="spread"),
        pytest.param([3, 3, 3], [1.0, 1.0, 1.0], id="all-equal"),
        pytest.param([7], [1.0], id="single"),
        pytest.param([2, 6], [1.0, 0.0], id="two"),
        pytest.param([4, 0, 1], [0.0, 1.0, 0.75], id="unsorted"),
    ],
)
def test_queue_score_is_min_max_when_metrics_present(
    queues: list[int], expected: list[float]
) -> None:
    endpoints = [make_endpoint(i, queue=q) for i, q in enumerate(queues)]
    scores = _queue_scorer().score(make_cycle(), make_request(), endpoints)
    assert [scores[ep.id] for ep in endpoints] == pytest.approx(expected)


def test_queue_score_excludes_missing_metrics_when_computing_range() -> None:
    endpoints = [
        make_endpoint(0, queue=2),
        dataclasses.replace(make_endpoint(1), metrics=None),
        make_endpoint(2, queue=4),
    ]
    scores = _queue_scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 1.0, endpoints[1].id: 0.0, endpoints[2].id: 0.0}


def test_queue_score_is_zero_when_no_endpoint_has_metrics() -> None:
    endpoints = [dataclasses.replace(make_endpoint(i), metrics=None) for i in range(2)]
    scores = _queue_scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 0.0, endpoints[1].id: 0.0}


def test_queue_score_is_empty_when_no_endpoints() -> None:
    assert _queue_scorer().score(make_cycle(), make_request(), []) == {}


def test_plugin_is_distribution_scorer_without_params_when_constructed() -> None:
    plugin = QueueScorer(name="", params=decode(QueueScorer.Params, None), handle=handle())
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.DISTRIBUTION
    assert plugin.typed_name == TypedName(type="queue-scorer", name="queue-scorer")


def test_params_rejected_when_unknown_key_given() -> None:
    with pytest.raises(ParamError, match="threshold"):
        decode(QueueScorer.Params, {"threshold": 1})
