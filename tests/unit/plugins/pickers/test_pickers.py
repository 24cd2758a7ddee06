from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from epp.plugin import Picker, ScoredEndpoint
from epp.plugin.params import ParamError, decode
from epp.plugins.pickers.max_score import MaxScorePicker
from epp.plugins.pickers.random_picker import RandomPicker
from epp.plugins.pickers.weighted_random import WeightedRandomPicker
from tests.builders import handle, make_cycle, make_endpoint

PickerType = type[MaxScorePicker] | type[RandomPicker] | type[WeightedRandomPicker]
ALL_PICKERS = [
    pytest.param(MaxScorePicker, id="max-score"),
    pytest.param(RandomPicker, id="random"),
    pytest.param(WeightedRandomPicker, id="weighted-random"),
]


def _picker(cls: PickerType, **params: Any) -> Any:
    return cls(name="", params=decode(cls.Params, params), handle=handle())


def _scored(*scores: float) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(make_endpoint(i), s) for i, s in enumerate(scores)]


def _indices(result_targets: tuple[Any, ...], scored: list[ScoredEndpoint]) -> list[int]:
    endpoints = [s.endpoint for s in scored]
    return [endpoints.index(ep) for ep in result_targets]


@pytest.mark.parametrize(
    ("scores", "n", "expected"),
    [
        pytest.param((0.2, 0.9, 0.5), 1, [1], id="top-one"),
        pytest.param((0.2, 0.9, 0.5), 2, [1, 2], id="top-two-in-order"),
        pytest.param((0.2, 0.9, 0.5), 10, [1, 2, 0], id="n-above-count"),
        pytest.param((0.0, 0.0, 3.0), 1, [2], id="zeros"),
    ],
)
def test_max_score_picker_orders_by_score_when_scores_distinct(
    scores: tuple[float, ...], n: int, expected: list[int]
) -> None:
    scored = _scored(*scores)
    result = _picker(MaxScorePicker, maxNumOfEndpoints=n).pick(make_cycle(), scored)
    assert _indices(result.targets, scored) == expected
    assert result.scored == tuple(scored)


def test_max_score_picker_breaks_ties_randomly_when_scores_equal() -> None:
    scored = _scored(0.7, 0.7, 0.1)
    picker = _picker(MaxScorePicker)
    firsts = {
        _indices(picker.pick(make_cycle(seed), scored).targets, scored)[0] for seed in range(50)
    }
    assert firsts == {0, 1}


@pytest.mark.parametrize("cls", ALL_PICKERS)
def test_picker_is_deterministic_when_seed_fixed(cls: PickerType) -> None:
    scored = _scored(0.3, 0.3, 0.3, 0.6, 0.1)
    picker = _picker(cls, maxNumOfEndpoints=3)
    first = picker.pick(make_cycle(seed=7), scored).targets
    again = picker.pick(make_cycle(seed=7), scored).targets
    assert first == again
    assert len({ep.id for ep in first}) == 3


@pytest.mark.parametrize("cls", ALL_PICKERS)
def test_picker_returns_no_targets_when_no_candidates(cls: PickerType) -> None:
    result = _picker(cls).pick(make_cycle(), [])
    assert (result.targets, result.scored) == ((), ())


def test_random_picker_reaches_every_endpoint_when_seeds_vary() -> None:
    scored = _scored(1.0, 0.0, 0.5)
    picker = _picker(RandomPicker)
    firsts = Counter(
        _indices(picker.pick(make_cycle(seed), scored).targets, scored)[0] for seed in range(60)
    )
    assert set(firsts) == {0, 1, 2}


def test_weighted_random_picker_never_prefers_zero_score_when_some_positive() -> None:
    scored = _scored(0.0, 0.1, 0.0, 0.05)
    picker = _picker(WeightedRandomPicker, maxNumOfEndpoints=2)
    for seed in range(100):
        assert sorted(_indices(picker.pick(make_cycle(seed), scored).targets, scored)) == [1, 3]


def test_weighted_random_picker_picks_in_proportion_to_score_when_sampled() -> None:
    scored = _scored(0.75, 0.25)
    picker = _picker(WeightedRandomPicker)
    cycle = make_cycle(seed=3)
    draws = 4000
    firsts = Counter(_indices(picker.pick(cycle, scored).targets, scored)[0] for _ in range(draws))
    assert firsts[0] / draws == pytest.approx(0.75, abs=0.03)


def test_weighted_random_picker_acts_as_random_when_all_scores_zero() -> None:
    scored = _scored(0.0, 0.0, 0.0, -1.0)
    weighted = _picker(WeightedRandomPicker, maxNumOfEndpoints=2)
    uniform = _picker(RandomPicker, maxNumOfEndpoints=2)
    for seed in range(20):
        assert weighted.pick(make_cycle(seed), scored) == uniform.pick(make_cycle(seed), scored)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, 1, id="default"),
        pytest.param({"maxNumOfEndpoints": 3}, 3, id="explicit"),
        pytest.param({"maxNumOfEndpoints": 0}, 1, id="zero-means-one"),
        pytest.param({"maxNumOfEndpoints": -4}, 1, id="negative-means-one"),
    ],
)
def test_max_num_of_endpoints_normalised_when_decoded(
    params: dict[str, Any], expected: int
) -> None:
    assert decode(MaxScorePicker.Params, params).max_num_of_endpoints == expected


@pytest.mark.parametrize(
    ("params", "path"),
    [
        pytest.param({"maxNumOfEndpoints": "2"}, "maxNumOfEndpoints", id="wrong-type"),
        pytest.param({"maxNumOfPods": 2}, "maxNumOfPods", id="unknown-key"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], path: str) -> None:
    with pytest.raises(ParamError) as info:
        decode(RandomPicker.Params, params)
    assert info.value.path == path


@pytest.mark.parametrize(
    ("cls", "type_name"),
    [
        pytest.param(MaxScorePicker, "max-score-picker", id="max-score"),
        pytest.param(RandomPicker, "random-picker", id="random"),
        pytest.param(WeightedRandomPicker, "weighted-random-picker", id="weighted-random"),
    ],
)
def test_plugin_is_picker_when_constructed(cls: PickerType, type_name: str) -> None:
    plugin = _picker(cls)
    assert isinstance(plugin, Picker)
    assert plugin.typed_name.type == type_name
