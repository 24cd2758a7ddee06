"""``disaggregatedset-rollout-screener``: upstream's parameter checks, pod counting from endpoint
events and the share gauge, revision gating (covered revisions only, one revision per request,
drawn by share), strict and prefer header selectors, response-header stamping, and the wiring
(slotted as a screener, attached to an endpoint-notification source)."""

from __future__ import annotations

import dataclasses
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from epp.config.loader import LoadOptions, load_config
from epp.plugin import (
    Endpoint,
    EndpointEvent,
    EndpointEventType,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import check_hooks, check_plugin_class, check_screener, sample_request
from epp.plugins.screeners.disaggregatedset_rollout import (
    NO_MATCH_METRIC,
    SHARE_METRIC,
    DisaggregatedSetRolloutScreener,
)
from epp.plugins.sources.notification import EndpointNotificationSource
from tests.builders import FakeHandle, make_cycle, make_endpoint, make_request

REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"
SLICE = "disaggregatedset.x-k8s.io/slice"
SET = {"disaggregatedset.x-k8s.io/name": "my-set"}
SELECTORS = [
    {"name": "revision", "headerName": "X-Disagg-Revision", "labelKey": REV, "mode": "strict"},
    {"name": "slice", "headerName": "x-disagg-slice", "labelKey": SLICE, "mode": "prefer"},
]


def params(mode: str = "max-role", **extra: Any) -> dict[str, Any]:
    gating: dict[str, Any] = {"mode": mode}
    if mode != "disabled":
        gating["requireRoles"] = {"values": ["prefill", "decode"]}
    return {
        "scope": {"labelSelector": "disaggregatedset.x-k8s.io/name=my-set"},
        "headerSelectors": SELECTORS,
        "revisionGating": gating,
        **extra,
    }


def screener(handle: FakeHandle | None = None, **kw: Any) -> DisaggregatedSetRolloutScreener:
    p = decode(DisaggregatedSetRolloutScreener.Params, params(**kw))
    return DisaggregatedSetRolloutScreener(name="rollout", params=p, handle=handle or FakeHandle())


def pod(i: int, revision: str, role: str, **labels: str) -> Endpoint:
    return make_endpoint(i, labels={**SET, REV: revision, ROLE: role, **labels})


def join(s: DisaggregatedSetRolloutScreener, *endpoints: Endpoint) -> None:
    for e in endpoints:
        s.extract_endpoint(EndpointEvent(EndpointEventType.ADD_OR_UPDATE, e))


def leave(s: DisaggregatedSetRolloutScreener, *endpoints: Endpoint) -> None:
    for e in endpoints:
        s.extract_endpoint(EndpointEvent(EndpointEventType.DELETE, e))


def fleet(a: tuple[int, int], b: tuple[int, int]) -> list[Endpoint]:
    """``a`` = (prefill, decode) pods of revision A, ``b`` of B; numbered in that order."""
    out: list[Endpoint] = []
    for revision, (prefills, decodes) in (("A", a), ("B", b)):
        out += [pod(len(out) + i, revision, "prefill") for i in range(prefills)]
        out += [pod(len(out) + i, revision, "decode") for i in range(decodes)]
    return out


def share(handle: FakeHandle, revision: str, mode: str = "max-role") -> float | None:
    labels = {
        "plugin_type": "disaggregatedset-rollout-screener",
        "plugin_name": "rollout",
        "mode": mode,
        "revision": revision,
    }
    return handle.registry.get_sample_value(SHARE_METRIC, labels)


def revisions(endpoints: Sequence[Endpoint]) -> set[str]:
    return {e.labels.get(REV, "") for e in endpoints}


# ---- parameters -------------------------------------------------------------------------------


def test_contract() -> None:
    check_plugin_class(DisaggregatedSetRolloutScreener, "disaggregatedset-rollout-screener")
    s = screener()
    eps = fleet((2, 9), (1, 1))
    join(s, *eps)
    kept = check_screener(s, sample_request(), eps)
    assert len(revisions(kept)) == 1
    result = SchedulingResult({"decode": ProfileResult(targets=(eps[3],))}, "decode")
    check_hooks(s, sample_request(), result)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scope": {}}, "scope.labelSelector is required"),
        ({"scope": {"labelSelector": "a in ()"}}, "scope.labelSelector is not a valid label"),
        ({"revisionGating": None}, "revisionGating is required"),
        ({"revisionGating": {"mode": "fastest"}}, "must be one of sum|max-role|disabled"),
        ({"revisionGating": {"mode": "sum"}}, "requireRoles is required when revisionGating."),
        (
            {"revisionGating": {"mode": "sum", "requireRoles": {"values": []}}},
            "must contain at least one role",
        ),
        (
            {"revisionGating": {"mode": "sum", "requireRoles": {"values": ["decode", "decode"]}}},
            "contains duplicate role 'decode'",
        ),
        ({"headerSelectors": [{"name": "x"}]}, r"headerSelectors\[0\].headerName is required"),
        (
            {"headerSelectors": [{**SELECTORS[0], "mode": "maybe"}]},
            r"headerSelectors\[0\].mode 'maybe' must be one of strict\|prefer",
        ),
        ({"headerSelectors": [SELECTORS[0], SELECTORS[0]]}, "duplicate name 'revision'"),
        (
            {
                "headerSelectors": [
                    SELECTORS[0],
                    {**SELECTORS[1], "headerName": "x-disagg-REVISION"},
                ]
            },
            "duplicate headerName 'x-disagg-revision'",
        ),
    ],
)
def test_upstreams_parameter_checks(change: dict[str, Any], message: str) -> None:
    raw = {**params(mode="sum"), **change}
    if raw.get("revisionGating") is None:
        del raw["revisionGating"]
    with pytest.raises(ParamError, match=message):
        decode(DisaggregatedSetRolloutScreener.Params, raw)


def test_disabled_needs_no_roles_and_label_keys_default() -> None:
    p = decode(DisaggregatedSetRolloutScreener.Params, params(mode="disabled"))
    assert p.revision_gating is not None
    assert (p.revision_gating.revision_label, p.revision_gating.role_label) == (REV, ROLE)


# ---- counting and the share gauge -------------------------------------------------------------


def test_the_share_gauge_follows_the_pods() -> None:
    h = FakeHandle()
    s = screener(h)
    eps = fleet((2, 9), (1, 1))
    join(s, *eps)
    assert share(h, "A") == pytest.approx(0.9)
    assert share(h, "B") == pytest.approx(0.1)
    leave(s, eps[11])  # B's only prefill pod: B is no longer covered
    assert (share(h, "A"), share(h, "B")) == (1.0, 0.0)
    leave(s, eps[12])  # B's last pod: its series goes
    assert share(h, "B") is None
    assert s.dump_state() == {
        "mode": "max-role",
        "podsByRevisionAndRole": {"A": {"prefill": 2, "decode": 9}},
        "shares": {"A": 1.0},
    }


def test_a_pod_that_changes_revision_moves_the_shares() -> None:
    h = FakeHandle()
    s = screener(h, mode="sum")
    eps = fleet((1, 1), (1, 1))
    join(s, *eps)
    assert share(h, "A", "sum") == 0.5
    moved = dataclasses.replace(eps[1], labels={**eps[1].labels, REV: "B"})
    join(s, moved)  # A's decode pod is now B's: A is not covered
    assert (share(h, "A", "sum"), share(h, "B", "sum")) == (0.0, 1.0)


def test_pods_out_of_scope_or_without_labels_are_not_counted() -> None:
    h = FakeHandle()
    s = screener(h)
    other_set = make_endpoint(5, labels={REV: "C", ROLE: "decode", "x": "y"})
    no_role = make_endpoint(6, labels={**SET, REV: "C"})
    join(s, *fleet((1, 1), (0, 0)), other_set, no_role)
    assert s.dump_state()["podsByRevisionAndRole"] == {"A": {"prefill": 1, "decode": 1}}


def test_disabled_gating_counts_nothing_and_screens_nothing_without_a_header() -> None:
    h = FakeHandle()
    s = screener(h, mode="disabled")
    eps = fleet((1, 1), (1, 0))  # B is not covered
    join(s, *eps)
    assert share(h, "A", "disabled") is None
    assert s.screen(make_cycle(), make_request(), eps) == eps


# ---- gating -----------------------------------------------------------------------------------


def test_each_request_gets_one_covered_revision_drawn_by_share() -> None:
    s = screener()
    eps = [*fleet((2, 9), (1, 1)), pod(20, "C", "decode")]  # C: no prefill, never chosen
    join(s, *eps)
    drawn: Counter[str] = Counter()
    for seed in range(2000):
        kept = s.screen(make_cycle(seed), make_request(), eps)
        (revision,) = revisions(kept)
        kept_ids = [e.id for e in kept]
        assert kept_ids == [e.id for e in eps if e.labels[REV] == revision]  # order kept
        drawn[revision] += 1
    assert set(drawn) == {"A", "B"}
    assert 0.87 < drawn["A"] / 2000 < 0.93  # max-role: 90% to A


def test_candidates_outside_the_counted_revisions_fail_closed() -> None:
    s = screener()
    eps = fleet((1, 1), (0, 0))
    assert s.screen(make_cycle(), make_request(), eps) == []  # no pod heard yet: 503
    join(s, *eps)
    unlabeled = make_endpoint(9)
    kept = s.screen(make_cycle(), make_request(), [*eps, unlabeled])
    assert [e.id for e in kept] == [e.id for e in eps]


def test_only_revisions_among_the_candidates_are_drawn() -> None:
    s = screener()
    eps = fleet((1, 1), (1, 9))
    join(s, *eps)
    only_a = eps[:2]  # e.g. a subset hint: B has the larger share but no candidate
    for seed in range(50):
        assert s.screen(make_cycle(seed), make_request(), only_a) == only_a


# ---- header selectors -------------------------------------------------------------------------


def test_a_strict_header_pins_the_revision_and_no_revision_is_drawn() -> None:
    s = screener()
    eps = fleet((2, 9), (1, 1))
    join(s, *eps)
    request = make_request(headers={"x-disagg-revision": "B"})
    for seed in range(30):
        assert revisions(s.screen(make_cycle(seed), request, eps)) == {"B"}


def test_a_strict_header_matching_nothing_fails_closed_and_is_counted() -> None:
    h = FakeHandle()
    s = screener(h)
    eps = fleet((1, 1), (1, 1))
    join(s, *eps)
    missing = make_request(headers={"x-disagg-revision": "Z"})
    assert s.screen(make_cycle(), missing, eps) == []
    labels = {
        "plugin_type": "disaggregatedset-rollout-screener",
        "plugin_name": "rollout",
        "selector": "revision",
    }
    assert h.registry.get_sample_value(f"{NO_MATCH_METRIC}_total", labels) == 1.0


def test_a_strict_header_on_an_uncovered_revision_fails_closed() -> None:
    s = screener()
    eps = fleet((1, 1), (0, 1))  # B has no prefill pod
    join(s, *eps)
    assert s.screen(make_cycle(), make_request(headers={"x-disagg-revision": "B"}), eps) == []


def test_with_gating_disabled_a_strict_header_still_screens() -> None:
    s = screener(mode="disabled")
    eps = fleet((1, 1), (1, 1))
    request = make_request(headers={"x-disagg-revision": "B"})
    assert revisions(s.screen(make_cycle(), request, eps)) == {"B"}


def test_a_prefer_header_screens_nothing() -> None:
    s = screener(mode="disabled")
    eps = [pod(0, "A", "decode", **{SLICE: "0"}), pod(1, "A", "decode", **{SLICE: "1"})]
    assert s.screen(make_cycle(), make_request(headers={"x-disagg-slice": "1"}), eps) == eps


# ---- stamping ---------------------------------------------------------------------------------


def stamped(
    s: DisaggregatedSetRolloutScreener, targets: Sequence[Endpoint], served: str
) -> Mapping[str, str]:
    request = make_request()
    s.pre_request(
        request, SchedulingResult({"decode": ProfileResult(targets=tuple(targets))}, "decode")
    )
    out: dict[str, str] = {}
    s.response_headers(request, ResponseInfo(request.request_id, {}, served_endpoint=served), out)
    return out


def test_the_served_endpoints_labels_are_stamped_on_the_response() -> None:
    s = screener()
    first = pod(0, "A", "decode", **{SLICE: "0"})
    second = pod(1, "B", "decode")  # no slice label: no slice header
    assert stamped(s, [first, second], "") == {"x-disagg-revision": "A", "x-disagg-slice": "0"}
    assert stamped(s, [first, second], second.hostport) == {"x-disagg-revision": "B"}
    assert stamped(s, [first, second], "10.9.9.9:1") == {
        "x-disagg-revision": "A",
        "x-disagg-slice": "0",
    }


def test_a_request_never_routed_gets_no_stamp() -> None:
    out: dict[str, str] = {}
    screener().response_headers(make_request(), ResponseInfo("r", {}), out)
    assert out == {}


# ---- wiring -----------------------------------------------------------------------------------

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: disaggregatedset-rollout-screener
  name: rollout-screener
  parameters:
    scope: {labelSelector: "disaggregatedset.x-k8s.io/name=my-set"}
    revisionGating: {mode: sum, requireRoles: {values: [prefill, decode]}}
- type: header-label-affinity-scorer
  name: slice-affinity
  parameters: {headerName: x-disagg-slice, labelKey: disaggregatedset.x-k8s.io/slice}
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slice-affinity
    weight: 3
  - pluginRef: queue-scorer
"""


def test_the_loader_slots_it_as_a_screener_hearing_endpoint_events() -> None:
    pipeline = load_config(
        textwrap.dedent(CONFIG),
        registry=PluginRegistry.from_entry_points(),
        handle_for=FakeHandle,
        options=LoadOptions(allow_experimental=True),
    )
    s = pipeline.instances["rollout-screener"]
    assert pipeline.screeners == [s]
    assert s in pipeline.pre_request and s in pipeline.response_headers
    (notified,) = [p for p in pipeline.sources if isinstance(p.source, EndpointNotificationSource)]
    assert s in notified.extractors
    assert pipeline.describe()["screeners"] == [
        "rollout-screener/disaggregatedset-rollout-screener"
    ]
