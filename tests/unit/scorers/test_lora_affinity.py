from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import NoParams, Scorer, ScorerCategory
from scorers.lora_affinity import LoraAffinityScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request


def _scorer() -> LoraAffinityScorer:
    return LoraAffinityScorer(name="", params=NoParams(), handle=handle())


@pytest.mark.parametrize(
    ("active", "waiting", "max_lora", "expected"),
    [
        pytest.param({"sql"}, set(), 1, 1.0, id="active"),
        pytest.param({"sql", "b"}, {"c"}, 2, 1.0, id="active-even-when-slots-full"),
        pytest.param({"sql"}, {"sql"}, 4, 1.0, id="active-and-waiting"),
        pytest.param({"a"}, set(), 4, 0.8, id="free-slot"),
        pytest.param(set(), set(), 1, 0.8, id="free-slot-nothing-loaded"),
        pytest.param({"a"}, {"sql"}, 4, 0.8, id="free-slot-beats-waiting"),
        pytest.param({"a"}, {"sql"}, 2, 0.6, id="waiting-no-slot"),
        pytest.param({"a", "b"}, set(), 2, 0.0, id="slots-full"),
        pytest.param(set(), set(), 0, 0.0, id="lora-disabled"),
    ],
)
def test_score_ranks_adapter_state_when_metrics_present(
    active: set[str], waiting: set[str], max_lora: int, expected: float
) -> None:
    endpoint = make_endpoint(0, active=active, waiting=waiting, max_lora=max_lora)
    request = make_request(target_model="sql")
    assert _scorer().score(make_cycle(), request, [endpoint]) == {endpoint.id: expected}


def test_score_is_zero_when_metrics_missing() -> None:
    endpoint = dataclasses.replace(make_endpoint(0), metrics=None)
    request = make_request(target_model="sql")
    assert _scorer().score(make_cycle(), request, [endpoint]) == {endpoint.id: 0.0}


def test_score_covers_every_endpoint_when_several_given() -> None:
    endpoints = [
        make_endpoint(0, active={"sql"}, max_lora=1),
        make_endpoint(1, waiting={"sql"}, max_lora=1),
        make_endpoint(2, active={"x"}, max_lora=4),
    ]
    scores = _scorer().score(make_cycle(), make_request(target_model="sql"), endpoints)
    assert scores == {endpoints[0].id: 1.0, endpoints[1].id: 0.6, endpoints[2].id: 0.8}


def test_plugin_is_affinity_scorer_when_constructed() -> None:
    plugin = _scorer()
    assert isinstance(plugin, Scorer)
    assert plugin.category is ScorerCategory.AFFINITY
    assert plugin.typed_name.type == "lora-affinity-scorer"
