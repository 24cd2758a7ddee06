from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import Scorer, ScorerCategory
from epp.plugin.params import ParamError, decode
from scorers.load_aware import LoadAwareScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _scorer(**params: object) -> LoadAwareScorer:
    return LoadAwareScorer(name="", params=decode(LoadAwareScorer.Params, params), handle=handle())


@pytest.mark.parametrize(
    ("threshold", "queue", "expected"),
    [
        pytest.param(128, 0, 0.5, id="idle"),
        pytest.param(128, 32, 0.375, id="quarter-of-threshold"),
        pytest.param(128, 64, 0.25, id="half-of-threshold"),
        pytest.param(128, 127, 0.5 * (1 - 127 / 128), id="just-below"),
        pytest.param(128, 128, 0.0, id="at-threshold"),
        pytest.param(128, 500, 0.0, id="over-threshold"),
        pytest.param(4, 1, 0.375, id="custom-threshold"),
        pytest.param(1, 1, 0.0, id="threshold-one"),
    ],
)
def test_score_follows_threshold_formula_when_queue_given(
    threshold: int, queue: int, expected: float
) -> None:
    endpoint = make_endpoint(0, queue=queue)
    scores = _scorer(threshold=threshold).score(make_cycle(), make_request(), [endpoint])
    assert scores == {endpoint.id: pytest.approx(expected)}


def test_score_is_zero_when_metrics_missing() -> None:
    endpoint = dataclasses.replace(make_endpoint(0), metrics=None)
    assert _scorer().score(make_cycle(), make_request(), [endpoint]) == {endpoint.id: 0.0}


def test_threshold_defaults_to_128_when_not_configured() -> None:
    assert decode(LoadAwareScorer.Params, None).threshold == 128


@pytest.mark.parametrize(
    ("params", "path"),
    [
        pytest.param({"threshold": 0}, "", id="zero"),
        pytest.param({"threshold": -3}, "", id="negative"),
        pytest.param({"threshold": "high"}, "threshold", id="wrong-type"),
        pytest.param({"queueThreshold": 5}, "queueThreshold", id="unknown-key"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, object], path: str) -> None:
    with pytest.raises(ParamError) as info:
        decode(LoadAwareScorer.Params, params)
    assert info.value.path == path


def test_plugin_is_distribution_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.DISTRIBUTION
    assert plugin.typed_name.type == "load-aware-scorer"
