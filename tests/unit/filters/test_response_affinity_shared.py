"""``response-affinity-filter`` across EPP replicas: bindings exported by one replica pin the
other's follow-ups; duplicates, reordering, loss, bounds and TTL (``SharedState``)."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import generate_latest

from epp.plugin import SharedState
from filters import response_affinity
from filters.response_affinity import ResponseAffinityFilter
from tests.builders import NOW, make_cycle
from tests.unit.filters.test_response_affinity import POOL, PoolHandle, follow_up, plugin, serve


def replicas(**params: Any) -> tuple[ResponseAffinityFilter, ResponseAffinityFilter]:
    pair = plugin(PoolHandle(), **params), plugin(PoolHandle(), **params)
    for f in pair:
        assert f.export_facts() == []  # the sync engine's first call, made before any traffic
    return pair


def test_a_lone_replica_queues_nothing_for_export() -> None:
    """No syncer, so no export_facts call: bindings are not held for peers that do not exist."""
    f = plugin(PoolHandle())
    for i in range(10):
        serve(f, POOL[i % len(POOL)], f"resp_{i}")
    assert f.dump_state()["bindings"] == 10
    assert f.dump_state()["pendingExport"] == 0
    assert f.export_facts() == []  # the first call starts the queueing
    serve(f, POOL[0], "resp_x")
    assert [fact["id"] for fact in f.export_facts()] == ["resp_x"]


def sync(source: ResponseAffinityFilter, target: ResponseAffinityFilter) -> list[Any]:
    """One sync round from ``source`` to ``target``, through JSON as a transport would."""
    facts = json.loads(json.dumps(source.export_facts()))
    target.apply_facts(facts, "replica-a")
    return facts


def pinned(f: ResponseAffinityFilter, response_id: str, now: float = NOW) -> list[Any]:
    return list(f.filter(make_cycle(now=now), follow_up(response_id), POOL))


def at(f: ResponseAffinityFilter, now: float) -> None:
    f.handle.now = now  # type: ignore[attr-defined]


def test_is_shared_state() -> None:
    f = plugin()
    assert isinstance(f, SharedState)
    assert f.export_facts() == []


def test_a_binding_learned_on_one_replica_pins_follow_ups_on_the_other() -> None:
    a, b = replicas()
    serve(a, POOL[2], "resp_a")
    assert pinned(b, "resp_a") == POOL  # not synced yet: a miss, every candidate
    facts = sync(a, b)
    assert facts == [{"id": "resp_a", "endpoint": POOL[2].id, "age": 0.0}]
    assert pinned(b, "resp_a") == [POOL[2]]
    assert a.export_facts() == []  # drained


def test_applied_bindings_are_not_re_exported() -> None:
    a, b = replicas()
    serve(a, POOL[1], "resp_x")
    sync(a, b)
    assert pinned(b, "resp_x") == [POOL[1]]  # a lookup refresh stays local too
    assert b.export_facts() == []
    serve(b, POOL[3], "resp_y")  # what b learns itself is exported
    assert [f["id"] for f in b.export_facts()] == ["resp_y"]


def test_duplicates_and_older_facts_never_override_a_fresher_binding() -> None:
    a, b = replicas(ttl="100s")
    serve(a, POOL[0], "resp_1")
    old = a.export_facts()
    at(a, NOW + 10)
    serve(a, POOL[3], "resp_1")  # rebound later (a conflicting binding of the same id)
    new = a.export_facts()
    at(b, NOW + 10)
    b.apply_facts(new, "a")
    b.apply_facts(old, "a")  # reordered: the older fact arrives last
    b.apply_facts(new, "a")  # duplicated
    assert pinned(b, "resp_1", NOW + 10) == [POOL[3]]
    # A binding b made itself, more recently, wins over a peer's older news.
    at(b, NOW + 20)
    serve(b, POOL[2], "resp_1")
    b.apply_facts(new, "a")
    assert pinned(b, "resp_1", NOW + 20) == [POOL[2]]


def test_applied_binding_lapses_ttl_after_it_was_bound_on_the_peer() -> None:
    a, b = replicas(ttl="10s")
    serve(a, POOL[1], "resp_t")
    at(a, NOW + 4)
    facts = a.export_facts()
    assert facts[0]["age"] == 4.0
    at(b, NOW + 4)
    b.apply_facts(facts, "a")
    assert pinned(b, "resp_t", NOW + 9) == [POOL[1]]  # used: refreshed locally to NOW + 19
    assert pinned(b, "resp_t", NOW + 30) == POOL
    too_old = [{"id": "resp_old", "endpoint": POOL[0].id, "age": 10.0}]
    b.apply_facts(too_old, "a")
    assert b.dump_state()["bindings"] == 0


def test_losing_a_batch_loses_only_its_bindings() -> None:
    a, b = replicas()
    serve(a, POOL[0], "resp_lost")
    a.export_facts()  # this batch never arrives
    serve(a, POOL[1], "resp_kept")
    sync(a, b)
    assert pinned(b, "resp_lost") == POOL
    assert pinned(b, "resp_kept") == [POOL[1]]


def test_a_peer_binding_never_evicts_a_fresher_local_one() -> None:
    a, b = replicas(maxEntries=2, ttl="100s")
    serve(a, POOL[0], "resp_peer_old")
    at(a, NOW + 5)
    facts = a.export_facts()  # bound 5 s before export
    at(b, NOW + 5)
    serve(b, POOL[1], "resp_b1")
    serve(b, POOL[2], "resp_b2")
    b.apply_facts(facts, "a")  # less recent than both: it is the one dropped
    assert pinned(b, "resp_b1", NOW + 5) == [POOL[1]]
    assert pinned(b, "resp_b2", NOW + 5) == [POOL[2]]
    assert pinned(b, "resp_peer_old", NOW + 5) == POOL
    # A fresher peer binding evicts the least recently used one, whoever learned it.
    at(a, NOW + 6)
    serve(a, POOL[3], "resp_peer_new")
    at(b, NOW + 6)
    sync(a, b)
    assert pinned(b, "resp_peer_new", NOW + 6) == [POOL[3]]
    assert b.dump_state()["bindings"] == 2
    assert pinned(b, "resp_b2", NOW + 6) == [POOL[2]]  # used at NOW + 5, after resp_b1
    assert pinned(b, "resp_b1", NOW + 6) == POOL


def test_export_is_capped_oldest_dropped_first(monkeypatch: Any) -> None:
    monkeypatch.setattr(response_affinity, "MAX_EXPORT", 3)
    h = PoolHandle()
    a = plugin(h)
    assert a.export_facts() == []  # sharing on
    for i in range(5):
        serve(a, POOL[i % 4], f"resp_{i}")
    assert [f["id"] for f in a.export_facts()] == ["resp_2", "resp_3", "resp_4"]
    text = generate_latest(h.registry).decode()
    assert 'event="export_dropped",plugin_name="response-affinity-filter"} 2.0' in text
    assert a.dump_state()["bindings"] == 5  # local bindings are not affected


def test_malformed_facts_are_ignored() -> None:
    h = PoolHandle()
    b = plugin(h)
    bad: list[Any] = [
        None,
        "resp",
        {"id": "r1", "endpoint": POOL[0].id},
        {"id": "", "endpoint": POOL[0].id, "age": 0},
        {"id": "r2", "endpoint": 7, "age": 0},
        {"id": "r3", "endpoint": POOL[0].id, "age": -1},
        {"id": "r4", "endpoint": POOL[0].id, "age": float("nan")},
        {"id": "r5", "endpoint": POOL[0].id, "age": True},
        {"id": "x" * 2000, "endpoint": POOL[0].id, "age": 0},
    ]
    b.apply_facts(bad, "a")
    assert b.dump_state()["bindings"] == 0
    text = generate_latest(h.registry).decode()
    assert f'event="ignored",plugin_name="response-affinity-filter"}} {len(bad)}.0' in text


def test_heap_stays_bounded_under_repeated_use() -> None:
    f = plugin(ttl="1h")
    serve(f, POOL[0], "resp_hot")
    for i in range(5000):
        assert pinned(f, "resp_hot", NOW + i * 0.001) == [POOL[0]]
    assert len(f._heap) <= 2 * len(f._bindings) + response_affinity._COMPACT_SLACK
