"""``session-affinity-scorer`` / ``-filter`` across EPP replicas (``SharedState``): ``session_id``
bindings made on one replica steer the other's requests; conflicts converge on the latest use;
duplicates, reordering, TTL, bounds, no echo."""

from __future__ import annotations

import json
from typing import Any

from epp.plugin import SharedState
from epp.plugin.params import decode
from filters.session_affinity import SessionAffinityFilter
from scorers import _session_bindings
from scorers.session_affinity import SessionAffinityScorer
from tests.builders import NOW, FakeHandle, make_cycle, make_request
from tests.unit.scorers.test_session_affinity import EPS, _result, _scorer, _turn

SESSION = {"sessionIdConfig": {"evictionTtlSeconds": 80}}


def replicas(**params: Any) -> tuple[SessionAffinityScorer, SessionAffinityScorer]:
    params = {"strategy": "session_id", **SESSION, **params}
    pair = _scorer(FakeHandle(), **params), _scorer(FakeHandle(), **params)
    for s in pair:
        assert s.export_facts() == []  # the sync engine's first call, made before any traffic
    return pair


def test_a_lone_replica_queues_nothing_for_export() -> None:
    """No syncer, so no export_facts call: bindings are not held for peers that do not exist."""
    a = _scorer(FakeHandle(), strategy="session_id", **SESSION)
    for i in range(10):
        _turn(a, {"x-session-id": f"s{i}"}, EPS[i % len(EPS)])
    assert a.dump_state()["bindings"] == 10
    assert a.dump_state()["pendingExport"] == 0 and a.dump_state()["exportDropped"] == 0
    assert a.export_facts() == []  # the first call starts the queueing
    _turn(a, {"x-session-id": "s-new"}, EPS[0])
    assert [fact["session"] for fact in a.export_facts()] == ["s-new"]


def sync(source: Any, target: Any) -> list[Any]:
    facts = json.loads(json.dumps(source.export_facts()))
    target.apply_facts(facts, "replica")
    return facts


def at(*scorers: Any, now: float) -> None:
    for s in scorers:
        s.handle.now = now


def preferred(scorer: SessionAffinityScorer, session: str) -> list[float]:
    scores = scorer.score(make_cycle(), make_request(headers={"x-session-id": session}), EPS)
    return [scores[e.id] for e in EPS]


def test_session_bound_on_one_replica_is_preferred_on_the_other() -> None:
    a, b = replicas()
    assert isinstance(a, SharedState)
    _turn(a, {"x-session-id": "s1"}, EPS[2])
    assert preferred(b, "s1") == [0.0] * 4
    facts = sync(a, b)
    assert facts == [{"session": "s1", "endpoint": EPS[2].id, "age": 0.0}]
    assert preferred(b, "s1") == [0.0, 0.0, 1.0, 0.0]
    assert b.export_facts() == []  # applied bindings are not re-exported
    assert a.export_facts() == []  # drained


def test_the_header_strategy_shares_nothing() -> None:
    a, b = _scorer(FakeHandle()), _scorer(FakeHandle())
    a.pre_request(make_request(), _result(EPS[1]))
    assert a.export_facts() == []
    b.apply_facts([{"session": "s", "endpoint": EPS[0].id, "age": 0}], "a")
    assert b.dump_state()["strategy"] == "encoded_endpoint_header"


def test_reuse_on_the_same_endpoint_is_re_exported_at_most_every_ttl_eighth() -> None:
    a, b = replicas()  # TTL 80 s: refresh shared every 10 s
    _turn(a, {"x-session-id": "s"}, EPS[1])
    sync(a, b)
    for step in range(1, 10):
        at(a, now=NOW + step)
        _turn(a, {"x-session-id": "s"}, EPS[1])
    assert a.export_facts() == []
    at(a, now=NOW + 10)
    _turn(a, {"x-session-id": "s"}, EPS[1])
    at(b, now=NOW + 10)
    assert [f["age"] for f in sync(a, b)] == [0.0]
    # The refreshes kept b's copy alive past the first use's TTL.
    at(b, now=NOW + 85)
    assert preferred(b, "s") == [0.0, 1.0, 0.0, 0.0]
    at(b, now=NOW + 91)
    assert preferred(b, "s") == [0.0] * 4


def test_a_move_is_exported_at_once() -> None:
    a, b = replicas()
    _turn(a, {"x-session-id": "s"}, EPS[3])
    sync(a, b)
    at(a, b, now=NOW + 1)
    request = make_request(headers={"x-session-id": "s"})
    a.score(make_cycle(), request, EPS[:3])  # EPS[3] is no candidate: the session moves
    a.pre_request(request, _result(EPS[0]))
    sync(a, b)
    assert preferred(b, "s") == [1.0, 0.0, 0.0, 0.0]


def test_new_and_moved_sessions_ask_for_prompt_sharing_refreshes_do_not() -> None:
    a, _ = replicas()
    _turn(a, {"x-session-id": "s"}, EPS[3])
    assert a.handle.shared_soon == 1 and len(a.export_facts()) == 1
    at(a, now=NOW + 20)  # a refresh due for export: it waits for the interval
    _turn(a, {"x-session-id": "s"}, EPS[3])
    assert a.handle.shared_soon == 1 and len(a.export_facts()) == 1
    request = make_request(headers={"x-session-id": "s"})
    a.score(make_cycle(), request, EPS[:3])  # moves
    a.pre_request(request, _result(EPS[0]))
    assert a.handle.shared_soon == 2


def test_concurrent_bindings_converge_on_the_latest_use() -> None:
    a, b = replicas()
    _turn(a, {"x-session-id": "s"}, EPS[0])  # a binds first ...
    at(a, b, now=NOW + 0.1)
    _turn(b, {"x-session-id": "s"}, EPS[1])  # ... b, not knowing, binds another endpoint later
    from_a, from_b = a.export_facts(), b.export_facts()
    b.apply_facts(from_a, "a")  # older news: b keeps its own and tells a once more
    a.apply_facts(from_b, "b")  # newer: a follows
    assert preferred(a, "s") == preferred(b, "s") == [0.0, 1.0, 0.0, 0.0]
    assert [f["endpoint"] for f in b.export_facts()] == [EPS[1].id]
    assert a.export_facts() == []


def test_duplicates_and_reordered_facts_change_nothing() -> None:
    a, b = replicas()
    _turn(a, {"x-session-id": "s"}, EPS[0])
    first = a.export_facts()
    at(a, now=NOW + 2)
    request = make_request(headers={"x-session-id": "s"})
    a.score(make_cycle(), request, EPS[1:])
    a.pre_request(request, _result(EPS[2]))  # moved to EPS[2]
    second = a.export_facts()
    at(b, now=NOW + 2)
    for facts in (second, first, second, first):
        b.apply_facts(facts, "a")
    assert preferred(b, "s") == [0.0, 0.0, 1.0, 0.0]
    assert b.export_facts() == [{"session": "s", "endpoint": EPS[2].id, "age": 0.0}]


def test_an_applied_binding_lapses_ttl_after_the_peers_last_use() -> None:
    a, b = replicas()
    _turn(a, {"x-session-id": "s"}, EPS[2])
    at(a, b, now=NOW + 30)
    b.apply_facts(a.export_facts(), "a")  # last used 30 s before export
    at(b, now=NOW + 80)
    assert preferred(b, "s") == [0.0, 0.0, 1.0, 0.0]
    at(b, now=NOW + 81)
    assert preferred(b, "s") == [0.0] * 4
    b.apply_facts([{"session": "t", "endpoint": EPS[0].id, "age": 81}], "a")
    assert b.dump_state()["bindings"] <= 1 and preferred(b, "t") == [0.0] * 4


def test_a_peer_binding_never_evicts_a_fresher_local_one() -> None:
    a, b = replicas()
    b._bindings.capacity = 2
    _turn(a, {"x-session-id": "peer"}, EPS[0])
    at(a, b, now=NOW + 5)
    facts = a.export_facts()  # last used 5 s before export
    _turn(b, {"x-session-id": "b1"}, EPS[1])
    _turn(b, {"x-session-id": "b2"}, EPS[2])
    b.apply_facts(facts, "a")
    assert preferred(b, "peer") == [0.0] * 4
    assert preferred(b, "b1") == [0.0, 1.0, 0.0, 0.0]
    assert preferred(b, "b2") == [0.0, 0.0, 1.0, 0.0]


def test_export_is_capped_and_malformed_facts_are_ignored(monkeypatch: Any) -> None:
    monkeypatch.setattr(_session_bindings, "MAX_EXPORT", 2)
    a, b = replicas()
    for i in range(4):
        _turn(a, {"x-session-id": f"s{i}"}, EPS[i])
    assert [f["session"] for f in a.export_facts()] == ["s2", "s3"]
    assert a.dump_state()["exportDropped"] == 2
    bad: list[Any] = [
        7,
        {"session": "s", "endpoint": EPS[0].id},
        {"session": "s", "endpoint": "", "age": 0},
        {"session": 3, "endpoint": EPS[0].id, "age": 0},
        {"session": "s", "endpoint": EPS[0].id, "age": -2},
        {"session": "s", "endpoint": EPS[0].id, "age": "0"},
    ]
    b.apply_facts(bad, "a")
    assert b.dump_state()["bindings"] == 0


def test_the_filter_shares_its_composed_scorers_bindings() -> None:
    params = decode(SessionAffinityFilter.Params, {"strategy": "session_id"})
    a = SessionAffinityFilter(name="pin", params=params, handle=FakeHandle())
    b = SessionAffinityFilter(name="pin", params=params, handle=FakeHandle())
    assert isinstance(a, SharedState) and a.typed_name.name == "pin"
    assert a.export_facts() == [] and b.export_facts() == []  # the sync engine's first calls
    request = make_request(headers={"x-session-id": "s"})
    a.filter(make_cycle(), request, EPS)
    a.pre_request(request, _result(EPS[3]))
    assert b.filter(make_cycle(), make_request(headers={"x-session-id": "s"}), EPS) == EPS
    sync(a, b)
    assert b.filter(make_cycle(), make_request(headers={"x-session-id": "s"}), EPS) == [EPS[3]]
    assert b.export_facts() == []
