from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import Endpoint, Filter, Metrics, Stability, with_attribute
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter, sample_endpoints
from filters.endpoint_attribute import EndpointAttributeFilter
from tests.builders import handle, make_cycle, make_endpoint, make_request

GPU = {"attribute": "GPUUtilization", "producer": "dcgm-extractor"}


def _filter(**params: Any) -> EndpointAttributeFilter:
    params.setdefault("algorithm", {"type": "threshold", "threshold": {"operator": "LessThan"}})
    decoded = decode(EndpointAttributeFilter.Params, params)
    return EndpointAttributeFilter(name="", params=decoded, handle=handle())


def _threshold(operator: str, value: float) -> dict[str, Any]:
    return {"type": "threshold", "threshold": {"operator": operator, "value": value}}


def _gpu(i: int, util: float | None) -> Endpoint:
    return dataclasses.replace(
        make_endpoint(i), metrics=with_attribute(Metrics(), GPU_UTILIZATION, util)
    )


def _kept(flt: EndpointAttributeFilter, endpoints: list[Endpoint]) -> list[int]:
    out = flt.filter(make_cycle(), make_request(), endpoints)
    return [endpoints.index(e) for e in out]


UTILS = [0.2, 0.5, 0.9, 0.95]


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        ("LessThan", [0, 1]),
        ("LessThanOrEqual", [0, 1, 2]),
        ("GreaterThan", [3]),
        ("GreaterThanOrEqual", [2, 3]),
        ("Equal", [2]),
        ("NotEqual", [0, 1, 3]),
    ],
)
def test_threshold_operators(operator: str, expected: list[int]) -> None:
    flt = _filter(**GPU, algorithm=_threshold(operator, 0.9))
    assert _kept(flt, [_gpu(i, u) for i, u in enumerate(UTILS)]) == expected


def test_on_missing_pass_keeps_and_fail_drops_endpoints_without_attribute() -> None:
    endpoints = [_gpu(0, 0.95), _gpu(1, None), _gpu(2, 0.1)]
    algo = _threshold("LessThanOrEqual", 0.9)
    assert _kept(_filter(**GPU, algorithm=algo), endpoints) == [1, 2]
    assert _kept(_filter(**GPU, algorithm=algo, onMissing=""), endpoints) == [1, 2]
    assert _kept(_filter(**GPU, algorithm=algo, onMissing="Fail"), endpoints) == [2]


def test_fallback_on_empty_returns_all_candidates_only_when_set() -> None:
    endpoints = [_gpu(0, 0.95), _gpu(1, 0.99)]
    algo = _threshold("LessThanOrEqual", 0.9)
    assert _kept(_filter(**GPU, algorithm=algo), endpoints) == []
    assert _kept(_filter(**GPU, algorithm=algo, fallbackOnEmpty=True), endpoints) == [0, 1]


def test_without_producer_reads_core_extractor_custom_metric() -> None:
    endpoints = [
        dataclasses.replace(make_endpoint(0), metrics=Metrics(custom={"num_running": 12})),
        dataclasses.replace(make_endpoint(1), metrics=Metrics(custom={"num_running": 3})),
        # the same name published by another producer is not the core extractor's
        dataclasses.replace(make_endpoint(2), metrics=Metrics(attributes={"num_running/x": 1})),
    ]
    flt = _filter(attribute="num_running", algorithm=_threshold("LessThan", 10), onMissing="Fail")
    assert _kept(flt, endpoints) == [1]


def test_endpoint_without_metrics_is_missing() -> None:
    endpoint = dataclasses.replace(make_endpoint(0), metrics=None)
    assert _kept(_filter(**GPU, onMissing="Fail"), [endpoint]) == []
    assert _kept(_filter(**GPU), [endpoint]) == [0]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"attribute": ""}, "requires a non-empty attribute", id="attribute"),
        pytest.param({**GPU, "onMissing": "Drop"}, "onMissing must be 'Pass' or 'Fail'", id="miss"),
        pytest.param({**GPU, "algorithm": {"type": "topK"}}, "must be 'threshold'", id="type"),
        pytest.param(
            {**GPU, "algorithm": {"type": "threshold"}}, "requires algorithm.thres", id="t"
        ),
        pytest.param(
            {**GPU, "algorithm": _threshold("Below", 1)}, "operator must be one of", id="operator"
        ),
        pytest.param(
            {"attribute": "GPUUtilization/dcgm-extractor"}, "contains '/'", id="combined-spelling"
        ),
        pytest.param({**GPU, "weight": 1}, "unknown field", id="unknown"),
    ],
)
def test_rejects_invalid_parameters(params: dict[str, Any], message: str) -> None:
    params.setdefault("algorithm", _threshold("LessThan", 1))
    with pytest.raises(ParamError, match=message):
        decode(EndpointAttributeFilter.Params, params)


def test_is_an_alpha_filter_and_passes_the_contract_kit() -> None:
    flt = _filter(**GPU, algorithm=_threshold("LessThan", 0.5), onMissing="Fail")
    assert isinstance(flt, Filter)
    assert EndpointAttributeFilter.STABILITY is Stability.ALPHA
    for n in (0, 1, 7, 50):
        endpoints = [
            dataclasses.replace(
                e,
                metrics=with_attribute(e.metrics or Metrics(), GPU_UTILIZATION, (i % 10) / 10),
            )
            for i, e in enumerate(sample_endpoints(n, seed=n))
        ]
        check_filter(flt, endpoints)
