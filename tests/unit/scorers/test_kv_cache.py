from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import NoParams, Scorer, ScorerCategory
from scorers.kv_cache import KVCacheUtilizationScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _scorer() -> KVCacheUtilizationScorer:
    return KVCacheUtilizationScorer(name="", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("kv", "expected"),
    [
        pytest.param(0.0, 1.0, id="empty-cache"),
        pytest.param(0.25, 0.75, id="quarter"),
        pytest.param(0.9, 0.1, id="nearly-full"),
        pytest.param(1.0, 0.0, id="full"),
        pytest.param(1.2, 0.0, id="over-full-clamped"),
        pytest.param(-0.5, 1.0, id="negative-clamped"),
    ],
)
def test_score_is_free_fraction_when_metrics_present(kv: float, expected: float) -> None:
    endpoint = make_endpoint(0, kv=kv)
    scores = _scorer().score(make_cycle(), make_request(), [endpoint])
    assert scores == {endpoint.id: pytest.approx(expected)}


def test_score_is_zero_when_metrics_missing() -> None:
    endpoints = [dataclasses.replace(make_endpoint(0), metrics=None), make_endpoint(1, kv=0.5)]
    scores = _scorer().score(make_cycle(), make_request(), endpoints)
    assert scores == {endpoints[0].id: 0.0, endpoints[1].id: 0.5}


def test_plugin_is_distribution_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.DISTRIBUTION
    assert plugin.typed_name.type == "kv-cache-utilization-scorer"
