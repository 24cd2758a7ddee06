"""``response-affinity-filter``: learned bindings pin follow-ups; bounds and outcomes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import generate_latest

from epp.plugin import (
    Endpoint,
    Filter,
    PreRequest,
    ProfileResult,
    RequestBody,
    ResponseComplete,
    ResponseInfo,
    ResponseStreaming,
    SchedulingResult,
    StateDumper,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_filter
from filters.response_affinity import ResponseAffinityFilter
from tests.builders import NOW, FakeHandle, make_cycle, make_endpoint, make_request

POOL = [make_endpoint(i) for i in range(4)]


@dataclass
class PoolHandle(FakeHandle):
    pool: list[Endpoint] = field(default_factory=lambda: list(POOL))

    def endpoints(self) -> Sequence[Endpoint]:
        return self.pool


def plugin(h: PoolHandle | None = None, **params: Any) -> ResponseAffinityFilter:
    decoded = decode(ResponseAffinityFilter.Params, params)
    return ResponseAffinityFilter(name="", params=decoded, handle=h or PoolHandle())


def follow_up(previous: str | None) -> Any:
    payload: dict[str, Any] = {"model": "m", "input": "hi"}
    if previous is not None:
        payload["previous_response_id"] = previous
    return make_request(body=RequestBody(kind="responses", payload=payload, raw=b"{}"))


def serve(f: ResponseAffinityFilter, target: Endpoint, response_id: str, **info: Any) -> None:
    """One routed request to ``target`` whose response carried ``response_id``."""
    request = follow_up(None)
    f.pre_request(request, SchedulingResult({"default": ProfileResult((target,))}, "default"))
    f.response_complete(
        request, ResponseInfo(request_id="r", headers={}, response_id=response_id, **info)
    )


def outcomes(h: PoolHandle) -> dict[str, float]:
    text = generate_latest(h.registry).decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("llm_d_epp_response_affinity_lookups_total{"):
            outcome = line.split('outcome="')[1].split('"')[0]
            out[outcome] = float(line.rsplit(" ", 1)[1])
    return {k: v for k, v in out.items() if v}


def test_roles_and_contract_hold_when_constructed() -> None:
    f = plugin()
    for role in (Filter, PreRequest, ResponseStreaming, ResponseComplete, StateDumper):
        assert isinstance(f, role)
    check_filter(f, POOL, follow_up("resp_x"))


def test_follow_up_is_pinned_to_the_server_that_stored_its_previous_response() -> None:
    h = PoolHandle()
    f = plugin(h)
    serve(f, POOL[2], "resp_a")
    assert f.filter(make_cycle(), follow_up("resp_a"), POOL) == [POOL[2]]
    # A request naming no previous response, or an unknown one, keeps every candidate.
    assert f.filter(make_cycle(), follow_up(None), POOL) == POOL
    assert f.filter(make_cycle(), follow_up("resp_unknown"), POOL) == POOL
    assert outcomes(h) == {"hit": 1, "miss": 1}


def test_served_endpoint_wins_over_the_primary_target_when_envoy_reports_it() -> None:
    f = plugin()
    serve(f, POOL[0], "resp_b", served_endpoint=POOL[3].hostport)
    assert f.filter(make_cycle(), follow_up("resp_b"), POOL) == [POOL[3]]


@pytest.mark.parametrize(
    "info", [pytest.param({"status": 404}, id="error-status"), pytest.param({}, id="no-id")]
)
def test_nothing_is_bound_when_response_failed_or_has_no_id(info: dict[str, Any]) -> None:
    f = plugin()
    request = follow_up(None)
    f.pre_request(request, SchedulingResult({"d": ProfileResult((POOL[1],))}, "d"))
    rid = "" if not info else "resp_c"
    f.response_complete(request, ResponseInfo(request_id="r", headers={}, response_id=rid, **info))
    assert f.dump_state()["bindings"] == 0


def test_a_streamed_response_is_bound_at_its_first_chunk_and_shared_at_once() -> None:
    h = PoolHandle()
    f = plugin(h)
    assert f.export_facts() == []  # sharing on: the sync engine's first call
    request = follow_up(None)
    f.pre_request(request, SchedulingResult({"d": ProfileResult((POOL[2],))}, "d"))
    info = ResponseInfo(request_id="r", headers={}, streaming=True)
    f.response_streaming(request, info)  # a chunk before the id: nothing yet
    assert f.dump_state()["bindings"] == 0 and h.shared_soon == 0
    info.response_id = "resp_s"  # response.created read on this chunk
    f.response_streaming(request, info)
    assert f.filter(make_cycle(), follow_up("resp_s"), POOL) == [POOL[2]]
    assert h.shared_soon == 1
    assert [fact["id"] for fact in f.export_facts()] == ["resp_s"]
    f.response_streaming(request, info)  # later chunks and completion: bound once
    info.end_of_stream = True
    f.response_complete(request, info)
    assert h.shared_soon == 1 and f.export_facts() == []


def test_an_id_seen_only_at_completion_is_bound_then() -> None:
    h = PoolHandle()
    f = plugin(h)
    serve(f, POOL[1], "resp_late")
    assert f.filter(make_cycle(), follow_up("resp_late"), POOL) == [POOL[1]]
    assert h.shared_soon == 1


def test_candidates_pass_and_outcome_says_why_when_bound_endpoint_is_gone_or_filtered() -> None:
    h = PoolHandle()
    f = plugin(h)
    serve(f, POOL[1], "resp_d")
    # Still in the pool but removed by an earlier filter: route normally.
    assert f.filter(make_cycle(), follow_up("resp_d"), [POOL[0], POOL[2]]) == [POOL[0], POOL[2]]
    h.pool = [POOL[0], POOL[2], POOL[3]]
    assert f.filter(make_cycle(), follow_up("resp_d"), h.pool) == h.pool
    assert outcomes(h) == {"not_candidate": 1, "pod_gone": 1}


def test_binding_lapses_after_ttl_and_use_refreshes_it() -> None:
    h = PoolHandle()
    f = plugin(h, ttl="10s")
    serve(f, POOL[1], "resp_e")  # bound at NOW, lapses at NOW + 10
    assert f.filter(make_cycle(now=NOW + 8), follow_up("resp_e"), POOL) == [POOL[1]]
    assert f.filter(make_cycle(now=NOW + 17), follow_up("resp_e"), POOL) == [POOL[1]]
    assert f.filter(make_cycle(now=NOW + 28), follow_up("resp_e"), POOL) == POOL
    assert f.dump_state()["bindings"] == 0


def test_least_recently_used_binding_goes_first_when_max_entries_reached() -> None:
    f = plugin(maxEntries=2)
    serve(f, POOL[0], "resp_1")
    serve(f, POOL[1], "resp_2")
    assert f.filter(make_cycle(), follow_up("resp_1"), POOL) == [POOL[0]]  # now most recent
    serve(f, POOL[2], "resp_3")
    assert f.filter(make_cycle(), follow_up("resp_2"), POOL) == POOL
    assert f.filter(make_cycle(), follow_up("resp_1"), POOL) == [POOL[0]]
    assert f.dump_state()["bindings"] == 2


@pytest.mark.parametrize(
    "params", [{"maxEntries": 0}, {"ttl": "0s"}, {"ttl": "soon"}, {"entries": 3}]
)
def test_params_rejected_when_invalid(params: dict[str, Any]) -> None:
    with pytest.raises(ParamError, match=r"maxEntries|ttl|duration|unknown field"):
        decode(ResponseAffinityFilter.Params, params)


@pytest.mark.parametrize(
    ("kind", "status", "needed"),
    [("responses", 200, True), ("responses", 404, False), ("chat", 200, False)],
)
def test_it_needs_only_the_body_of_a_successful_responses_api_answer(
    kind: str, status: int, needed: bool
) -> None:
    request = make_request(body=RequestBody(kind=kind, payload={"model": "m"}, raw=b"{}"))
    response = ResponseInfo(request_id="r", headers={}, status=status)
    assert plugin().needs_response_body(request, response) is needed
