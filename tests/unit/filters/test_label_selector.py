from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import Filter
from epp.plugin.params import ParamError, decode
from filters.label_selector import LabelSelectorFilter
from tests.builders import handle, make_cycle, make_endpoint, make_request

LABELS = [
    {"role": "decode", "zone": "a"},
    {"role": "prefill", "zone": "b"},
    {"role": "decode", "zone": "c", "canary": "true"},
    {},
]


def _kept(params: dict[str, Any]) -> list[int]:
    plugin = LabelSelectorFilter(
        name="", params=decode(LabelSelectorFilter.Params, params), handle=handle()
    )
    endpoints = [make_endpoint(i, labels=labels) for i, labels in enumerate(LABELS)]
    kept = plugin.filter(make_cycle(), make_request(), endpoints)
    return [endpoints.index(ep) for ep in kept]


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, [0, 1, 2, 3], id="empty-selector-keeps-all"),
        pytest.param({"matchLabels": {"role": "decode"}}, [0, 2], id="match-labels"),
        pytest.param(
            {"matchLabels": {"role": "decode", "zone": "c"}}, [2], id="match-labels-all-pairs"
        ),
        pytest.param({"matchLabels": {"role": "encode"}}, [], id="match-labels-none"),
        pytest.param({"matchExpressions": [_expr("zone", "In", "a", "b")]}, [0, 1], id="in"),
        pytest.param(
            {"matchExpressions": [_expr("zone", "NotIn", "a", "b")]},
            [2, 3],
            id="not-in-keeps-unlabeled",
        ),
        pytest.param({"matchExpressions": [_expr("canary", "Exists")]}, [2], id="exists"),
        pytest.param(
            {"matchExpressions": [{"key": "canary", "operator": "DoesNotExist"}]},
            [0, 1, 3],
            id="does-not-exist-values-omitted",
        ),
        pytest.param(
            {
                "matchLabels": {"role": "decode"},
                "matchExpressions": [_expr("canary", "DoesNotExist")],
            },
            [0],
            id="labels-and-expressions",
        ),
        pytest.param(
            {"matchExpressions": [_expr("zone", "In", "a", "c"), _expr("role", "NotIn", "decode")]},
            [],
            id="all-expressions-must-hold",
        ),
    ],
)
def test_filter_keeps_matching_endpoints_when_selector_given(
    params: dict[str, Any], expected: list[int]
) -> None:
    assert _kept(params) == expected


@pytest.mark.parametrize(
    ("params", "path"),
    [
        pytest.param(
            {"matchExpressions": [_expr("zone", "In")]}, "matchExpressions[0]", id="in-no-values"
        ),
        pytest.param(
            {"matchExpressions": [_expr("zone", "Exists", "a")]},
            "matchExpressions[0]",
            id="exists-with-values",
        ),
        pytest.param(
            {"matchExpressions": [_expr("zone", "Equals", "a")]},
            "matchExpressions[0].operator",
            id="bad-operator",
        ),
        pytest.param(
            {"matchExpressions": [_expr("", "Exists")]}, "matchExpressions[0]", id="empty-key"
        ),
        pytest.param(
            {"matchExpressions": [{"operator": "Exists"}]},
            "matchExpressions[0].key",
            id="missing-key",
        ),
        pytest.param({"matchLabels": {"a": 1}}, "matchLabels.a", id="non-string-value"),
        pytest.param({"label": "role"}, "label", id="unknown-key"),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], path: str) -> None:
    with pytest.raises(ParamError) as info:
        decode(LabelSelectorFilter.Params, params)
    assert info.value.path == path


def test_plugin_is_filter_when_constructed() -> None:
    plugin = LabelSelectorFilter(
        name="decode-only", params=decode(LabelSelectorFilter.Params, None), handle=handle()
    )
    assert isinstance(plugin, Filter)
    assert str(plugin.typed_name) == "decode-only/label-selector-filter"
