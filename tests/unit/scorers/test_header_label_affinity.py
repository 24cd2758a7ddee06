"""``header-label-affinity-scorer``: 1 for an endpoint whose label equals the request header, 0 for
every other endpoint (none removed); no header, an unknown value or a missing label score 0."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class, check_scorer, sample_endpoints
from scorers.header_label_affinity import HeaderLabelAffinityScorer
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

SLICE = "disaggregatedset.x-k8s.io/slice"
EPS = [
    make_endpoint(0, labels={SLICE: "0"}),
    make_endpoint(1, labels={SLICE: "1"}),
    make_endpoint(2),
    make_endpoint(3, labels={SLICE: "1"}),
]


def scorer(**params: Any) -> HeaderLabelAffinityScorer:
    p = decode(
        HeaderLabelAffinityScorer.Params,
        {"headerName": "X-Disagg-Slice", "labelKey": SLICE, **params},
    )
    return HeaderLabelAffinityScorer(name="slice-affinity", params=p, handle=FakeHandle())


def scores(headers: dict[str, str]) -> list[float]:
    out = scorer().score(make_cycle(), make_request(headers=headers), EPS)
    return [out[e.id] for e in EPS]


def test_contract() -> None:
    check_plugin_class(HeaderLabelAffinityScorer, "header-label-affinity-scorer")
    s = scorer(labelKey="zone")
    check_scorer(s, sample_endpoints(6), make_request(headers={"x-disagg-slice": "z1"}))
    check_scorer(s, sample_endpoints(6))


def test_matching_endpoints_score_one_and_the_others_stay_at_zero() -> None:
    assert scores({"x-disagg-slice": "1"}) == [0.0, 1.0, 0.0, 1.0]
    assert scores({"x-disagg-slice": "0"}) == [1.0, 0.0, 0.0, 0.0]


def test_no_header_or_an_unknown_value_scores_zero_everywhere() -> None:
    assert scores({}) == [0.0] * 4
    assert scores({"x-disagg-slice": ""}) == [0.0] * 4
    assert scores({"x-disagg-slice": "7"}) == [0.0] * 4


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"headerName": ""}, "headerName is required"),
        ({"labelKey": ""}, "labelKey is required"),
    ],
)
def test_both_parameters_are_required(params: dict[str, str], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(HeaderLabelAffinityScorer.Params, {"headerName": "h", "labelKey": "l", **params})
