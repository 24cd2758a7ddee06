from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import (
    Endpoint,
    Metrics,
    Scorer,
    ScorerCategory,
    Stability,
    with_attribute,
)
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_scorer, sample_endpoints
from scorers.endpoint_attribute import EndpointAttributeScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request

GPU = {"attributeKey": "GPUUtilization", "producer": "dcgm-extractor"}


def _scorer(**params: Any) -> EndpointAttributeScorer:
    params.setdefault("algorithm", {"type": "linear_lower_is_better"})
    decoded = decode(EndpointAttributeScorer.Params, params)
    return EndpointAttributeScorer(name="", params=decoded, handle=handle())


def _gpu(i: int, util: float | None) -> Endpoint:
    return dataclasses.replace(
        make_endpoint(i), metrics=with_attribute(Metrics(), GPU_UTILIZATION, util)
    )


def _scores(scorer: EndpointAttributeScorer, values: list[float | None]) -> list[float]:
    endpoints = [_gpu(i, v) for i, v in enumerate(values)]
    out = scorer.score(make_cycle(), make_request(), endpoints)
    return [round(out[e.id], 6) for e in endpoints]


def test_adaptive_range_lower_is_better() -> None:
    assert _scores(_scorer(**GPU), [10.0, 20.0, 30.0, None]) == [1.0, 0.5, 0.0, 0.0]


def test_adaptive_range_higher_is_better_and_explicit_adaptive() -> None:
    algo = {"type": "linear_higher_is_better", "normalization": {"adaptiveRange": {}}}
    assert _scores(_scorer(**GPU, algorithm=algo), [10.0, 20.0, 30.0]) == [0.0, 0.5, 1.0]


def test_adaptive_range_equal_values_are_neutral_and_missing_scores_zero() -> None:
    assert _scores(_scorer(**GPU), [0.4, 0.4, None]) == [1.0, 1.0, 0.0]
    assert _scores(_scorer(**GPU), [None, None]) == [0.0, 0.0]


def test_fixed_range_clamps() -> None:
    algo = {
        "type": "linear_lower_is_better",
        "normalization": {"fixedRange": {"min": 0.0, "max": 1.0}},
    }
    assert _scores(_scorer(**GPU, algorithm=algo), [0.25, 1.5, -1.0, None]) == [
        0.75,
        0.0,
        1.0,
        0.0,
    ]
    algo["type"] = "linear_higher_is_better"
    assert _scores(_scorer(**GPU, algorithm=algo), [0.25, 1.5, None]) == [0.25, 1.0, 0.0]


def test_fixed_range_single_candidate_is_not_neutral() -> None:
    algo = {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"max": 100}}}
    assert _scores(_scorer(**GPU, algorithm=algo), [90.0]) == [0.1]


def test_without_producer_reads_core_extractor_custom_metric() -> None:
    endpoints = [
        dataclasses.replace(make_endpoint(0), metrics=Metrics(custom={"queue_depth": 2.0})),
        dataclasses.replace(make_endpoint(1), metrics=Metrics(custom={"queue_depth": 6.0})),
    ]
    out = _scorer(attributeKey="queue_depth").score(make_cycle(), make_request(), endpoints)
    assert [out[e.id] for e in endpoints] == [1.0, 0.0]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"attributeKey": ""}, "non-empty attributeKey", id="key"),
        pytest.param({**GPU, "algorithm": {"type": "log"}}, "algorithm.type must be", id="type"),
        pytest.param(
            {
                **GPU,
                "algorithm": {
                    "type": "linear_lower_is_better",
                    "normalization": {"fixedRange": {"min": 1, "max": 1}},
                },
            },
            "requires min < max",
            id="range",
        ),
        pytest.param(
            {
                **GPU,
                "algorithm": {
                    "type": "linear_lower_is_better",
                    "normalization": {"fixedRange": {"max": 1}, "adaptiveRange": {}},
                },
            },
            "at most one normalization",
            id="both",
        ),
        pytest.param({"attributeKey": "a/b"}, "contains '/'", id="combined-spelling"),
    ],
)
def test_rejects_invalid_parameters(params: dict[str, Any], message: str) -> None:
    params.setdefault("algorithm", {"type": "linear_lower_is_better"})
    with pytest.raises(ParamError, match=message):
        decode(EndpointAttributeScorer.Params, params)


def test_is_an_alpha_distribution_scorer_and_passes_the_contract_kit() -> None:
    scorer = _scorer(**GPU)
    assert isinstance(scorer, Scorer)
    assert scorer.category is ScorerCategory.DISTRIBUTION
    assert EndpointAttributeScorer.STABILITY is Stability.ALPHA
    for n in (0, 1, 7, 50):
        endpoints = [
            dataclasses.replace(
                e,
                metrics=with_attribute(
                    e.metrics or Metrics(), GPU_UTILIZATION, (i % 10) / 10 if i % 3 else None
                ),
            )
            for i, e in enumerate(sample_endpoints(n, seed=n))
        ]
        check_scorer(scorer, endpoints)
