"""The deprecated ``by-label`` and ``by-label-selector`` filters."""

from __future__ import annotations

from typing import Any

import pytest

from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter
from epp.plugins.scoring.by_label import ByLabel, ByLabelSelector
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

ROLE = "llm-d.ai/role"
POOL = [
    make_endpoint(0, labels={ROLE: "decode"}),
    make_endpoint(1, labels={ROLE: "prefill"}),
    make_endpoint(2),
    make_endpoint(3, labels={ROLE: "both"}),
]


def _kept(cls: Any, **params: Any) -> list[int]:
    f = cls(name="f", params=decode(cls.Params, params), handle=FakeHandle())
    check_filter(f, POOL)
    return [POOL.index(e) for e in f.filter(make_cycle(), make_request(), POOL)]


def test_by_label_keeps_valid_values_and_unlabeled_only_when_allowed() -> None:
    assert _kept(ByLabel, label=ROLE, validValues=["decode", "both"]) == [0, 3]
    assert _kept(ByLabel, label=ROLE, validValues=["decode"], allowsNoLabel=True) == [0, 2]
    assert _kept(ByLabel, label=ROLE, allowsNoLabel=True) == [2]


@pytest.mark.parametrize(
    "params",
    [{}, {"label": ROLE}, {"validValues": ["decode"]}],
    ids=["nothing", "no-values-no-unlabeled", "no-label"],
)
def test_by_label_refuses_a_configuration_that_keeps_nothing(params: dict[str, Any]) -> None:
    with pytest.raises(ParamError, match=r"label|validValues"):
        decode(ByLabel.Params, params)


def test_by_label_selector_is_label_selector_filter_under_its_old_name() -> None:
    assert _kept(ByLabelSelector, matchLabels={ROLE: "decode"}) == [0]
    expr = {"key": ROLE, "operator": "In", "values": ["prefill", "both"]}
    assert _kept(ByLabelSelector, matchExpressions=[expr]) == [1, 3]
    assert _kept(ByLabelSelector) == [0, 1, 2, 3]
