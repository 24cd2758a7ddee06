"""The admin API's answers (``epp.server.admin``) with a real Director and scheduler: Explain's
scores, destination and refusals (and that explaining records nothing), ListEndpoints' metrics and
ages, DumpState's plugin dumps, queues and sharing state, and that every call is authorized."""

from __future__ import annotations

import dataclasses
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from epp._proto import epp_admin_v1_pb2 as pb
from epp.plugin import Metrics, TypedName
from epp.plugin.roles import ROLE_LABEL
from epp.server.admin import AdminError, AdminServicer, AdminSources
from tests.builders import make_endpoint
from tests.unit.requestcontrol.test_director import BODY, EPS, director


def _servicer(**kw: Any) -> AdminServicer:
    d = kw.pop("director", None) or director()
    kw.setdefault("endpoints", lambda: EPS)
    kw.setdefault("dumpers", ())
    return AdminServicer(AdminSources(director=d, **kw))


async def test_explain_scores_every_candidate_and_records_nothing() -> None:
    d = director()
    req = pb.ExplainRequest(headers={"X-Request-Id": "e1"}, body=BODY)
    resp = await _servicer(director=d).explain(req)
    assert (resp.outcome, resp.request_id, resp.path, resp.model, resp.target_model) == (
        "scheduled",
        "e1",
        "/v1/completions",
        "m",
        "m",
    )
    assert (resp.priority, resp.fairness_id, resp.candidates, resp.primary_profile) == (
        0,
        "default-flow",
        3,
        "p",
    )
    assert resp.destination == "192.168.1.3:8000"
    assert resp.scheduling_seconds >= 0 and resp.status == 0 and resp.error == ""
    [profile] = resp.profiles
    assert profile.name == "p" and list(profile.targets) == ["192.168.1.3:8000"]
    got = [(s.endpoint, s.id, round(s.total, 6), dict(s.scorers)) for s in profile.scores]
    assert got == [
        ("192.168.1.3:8000", EPS[2].id, 1.0, {"x/scorer": 1.0}),
        ("192.168.1.2:8000", EPS[1].id, 0.666667, {"x/scorer": 2 / 3}),
        ("192.168.1.1:8000", EPS[0].id, 0.333333, {"x/scorer": 1 / 3}),
    ]
    assert d.decisions.get("e1") is None


async def test_explain_honours_the_subset_hint_and_reports_a_refusal() -> None:
    svc = _servicer()
    req = pb.ExplainRequest(body=BODY, subset_hint=["192.168.1.1:8000"], has_subset_hint=True)
    resp = await svc.explain(req)
    assert resp.destination == "192.168.1.1:8000" and resp.candidates == 1
    req = pb.ExplainRequest(
        headers={"x-request-id": "r"}, body=BODY, subset_hint=["10.1.1.1"], has_subset_hint=True
    )
    resp = await svc.explain(req)
    assert (resp.outcome, resp.request_id, resp.path, resp.model, resp.status) == (
        "rejected",
        "r",
        "/v1/completions",
        "m",
        503,
    )
    assert resp.error == (
        "inference error: ServiceUnavailable - failed to find endpoint candidates for serving "
        "the request"
    )
    # an empty hint the caller did not mark as set is no hint
    resp = await svc.explain(pb.ExplainRequest(body=BODY))
    assert resp.outcome == "scheduled" and resp.candidates == 3


async def test_explain_uses_the_path_given() -> None:
    req = pb.ExplainRequest(headers={":path": "/v1/chat/completions"}, body=b"{}")
    resp = await _servicer().explain(req)
    assert resp.path == "/v1/chat/completions"


async def test_list_endpoints_reports_metrics_and_their_age() -> None:
    now = time.monotonic()
    scraped = dataclasses.replace(
        make_endpoint(0, labels={ROLE_LABEL: "decode", "zone": "a"}, queue=3, running=2, kv=0.5),
        rank=1,
    )
    scraped = dataclasses.replace(
        scraped,
        metrics=dataclasses.replace(
            scraped.metrics,  # type: ignore[arg-type]
            update_time=now - 5.0,
            active_models=frozenset({"b", "a"}),
            waiting_models=frozenset({"w"}),
            max_active_models=4,
            cache_block_size=16,
            cache_num_blocks=900,
            custom={"c": 1.5},
            attributes={"gpu": 8, "long": "x" * 300},
        ),
    )
    never = dataclasses.replace(make_endpoint(1), metrics=Metrics())
    bare = dataclasses.replace(make_endpoint(2), metrics=None)
    svc = _servicer(endpoints=lambda: [scraped, never, bare])
    resp = await svc.list_endpoints(pb.ListEndpointsRequest())
    a, b, c = resp.endpoints
    assert (a.id, a.address, a.rank, a.role, dict(a.labels)) == (
        scraped.id,
        "192.168.1.1:8000",
        1,
        "decode",
        {ROLE_LABEL: "decode", "zone": "a"},
    )
    assert a.scraped is True and 5.0 <= a.age_seconds < 60.0
    assert (a.waiting_queue_size, a.running_requests_size, a.kv_cache_usage_percent) == (3, 2, 0.5)
    assert list(a.active_models) == ["a", "b"] and list(a.waiting_models) == ["w"]
    assert (a.max_active_models, a.cache_block_size, a.cache_num_blocks) == (4, 16, 900)
    assert dict(a.custom) == {"c": 1.5}
    assert a.attributes["gpu"] == "8"
    assert len(a.attributes["long"]) < 300 and a.attributes["long"].endswith("…")
    assert b.scraped is False and b.age_seconds == 0.0 and b.role == ""
    assert c.scraped is False and c.id == bare.id and c.address == "192.168.1.3:8000"


class _Dumper:
    def __init__(self, name: str, state: dict[str, Any]) -> None:
        self.typed_name = TypedName("dumper-type", name)
        self.state = state

    def dump_state(self) -> dict[str, Any]:
        return self.state


async def test_dump_state_reports_plugins_queues_and_sharing() -> None:
    flow = SimpleNamespace(
        in_flight=lambda: 7, priorities=lambda: [0, -1], queued=lambda p: {0: 2, -1: 5}[p]
    )
    sync = SimpleNamespace(lag=lambda: 1.25, bootstrapped=True, outbox_size=9)
    dumpers = [_Dumper("idx", {"z": 1, "a": frozenset({3})})]
    svc = _servicer(dumpers=dumpers, flow=flow, sync=sync)
    resp = await svc.dump_state(pb.DumpStateRequest())
    [plugin] = resp.plugins
    assert (plugin.type, plugin.name) == ("dumper-type", "idx")
    assert plugin.json == '{"a": "frozenset({3})", "z": 1}'
    assert json.loads(plugin.json)["z"] == 1
    assert resp.flow_control.enabled is True and resp.flow_control.in_flight == 7
    assert dict(resp.flow_control.queued_by_priority) == {0: 2, -1: 5}
    s = resp.sharing
    assert (s.enabled, s.lag_seconds, s.bootstrapped, s.outbox_facts) == (True, 1.25, True, 9)
    resp = await _servicer().dump_state(pb.DumpStateRequest())
    assert resp.flow_control.enabled is False and resp.sharing.enabled is False
    assert resp.flow_control.in_flight == 0 and not resp.plugins


@pytest.mark.parametrize("method", ["Explain", "ListEndpoints", "DumpState"])
async def test_every_method_needs_the_token(method: str) -> None:
    svc = _servicer(token="s3cret")
    request = {
        "Explain": pb.ExplainRequest(body=BODY),
        "ListEndpoints": pb.ListEndpointsRequest(),
        "DumpState": pb.DumpStateRequest(),
    }[method]
    handler = svc.method(method)
    assert handler is not None
    with pytest.raises(AdminError) as err:
        await handler(request.SerializeToString(), "")
    assert (err.value.code, err.value.message) == (16, "a valid bearer token is required")
    response = type(request).__name__.replace("Request", "Response")
    ok = getattr(pb, response).FromString(
        await handler(request.SerializeToString(), "Bearer s3cret")
    )
    assert ok is not None


def test_only_the_three_methods_are_served() -> None:
    svc = _servicer()
    assert all(svc.method(n) is not None for n in ("Explain", "ListEndpoints", "DumpState"))
    assert svc.method("Other") is None
