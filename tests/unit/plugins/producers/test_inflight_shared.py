"""``inflight-load-producer`` across EPP replicas (``SharedState``): a peer's in-flight requests
count in ``InFlightLoad`` and ``LoadEstimate``; deltas and full refreshes; duplicates, reordering,
loss, expiry of a silent peer, bounds, no echo."""

from __future__ import annotations

import json
from typing import Any

import pytest

from epp.plugin import ProfileResult, SchedulingResult, SharedState
from epp.plugin.inflight import LOAD_ESTIMATE, InFlightLoad
from epp.plugins.producers import inflight_peers
from epp.plugins.producers.inflight import InflightLoadProducer
from scorers.active_request import ActiveRequestScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request
from tests.unit.plugins.producers.test_inflight import (
    EPS,
    T0,
    at,
    complete,
    dispatch,
    loads,
    producer,
)


def replicas(**kw: Any) -> tuple[InflightLoadProducer, InflightLoadProducer]:
    a, b = producer(**kw), producer(**kw)
    at(a, T0)
    at(b, T0)
    return a, b


def sync(source: InflightLoadProducer, target: InflightLoadProducer) -> list[Any]:
    facts = json.loads(json.dumps(source.export_facts()))
    target.apply_facts(facts, "replica-a")
    return facts


async def requests(p: InflightLoadProducer) -> list[int]:
    got = await loads(p)
    return [got[e.id].requests for e in EPS]


async def test_a_peers_requests_count_in_the_load_and_steer_the_scorer() -> None:
    a, b = replicas()
    assert isinstance(a, SharedState)
    for i in range(3):
        dispatch(a, f"a{i}", 0, tokens=100)
    dispatch(b, "b0", 1)
    scorer = ActiveRequestScorer(name="s", params=ActiveRequestScorer.Params(), handle=handle())
    request = make_request()
    await b.produce(request, EPS)
    assert scorer.score(make_cycle(), request, EPS)[EPS[0].id] == 1.0  # b alone: EPS[0] idle
    sync(a, b)
    request = make_request()
    await b.produce(request, EPS)
    assert request.attributes["InFlightLoad/inflight-load-producer"][EPS[0].id] == InFlightLoad(
        3, 300
    )
    scores = scorer.score(make_cycle(), request, EPS)
    assert scores[EPS[0].id] == 0.0 and scores[EPS[2].id] == 1.0
    assert await requests(a) == [3, 0, 0]  # a knows nothing of b until b exports


async def test_first_export_is_full_then_changed_endpoints_then_a_periodic_refresh() -> None:
    a, _ = replicas()
    dispatch(a, "r1", 0)
    dispatch(a, "r2", 1)
    first = a.export_facts()
    assert [(f["full"], f["loads"]) for f in first] == [
        (True, {EPS[0].id: [1, 0], EPS[1].id: [1, 0]})
    ]
    assert a.export_facts() == []  # nothing changed
    complete(a, "r1")
    assert [(f["full"], f["loads"]) for f in a.export_facts()] == [(False, {EPS[0].id: [0, 0]})]
    at(a, T0 + 1.0)
    assert [(f["full"], f["loads"]) for f in a.export_facts()] == [(True, {EPS[1].id: [1, 0]})]


async def test_a_lost_update_is_healed_by_the_next_full_refresh() -> None:
    a, b = replicas()
    dispatch(a, "r1", 2)
    sync(a, b)
    complete(a, "r1")
    a.export_facts()  # the "now idle" update is lost
    assert (await requests(b))[2] == 1
    at(a, T0 + 1.0)
    sync(a, b)  # full refresh: EPS[2] is not listed, so idle
    assert (await requests(b))[2] == 0


async def test_duplicates_and_reordered_facts_change_nothing() -> None:
    a, b = replicas()
    dispatch(a, "r1", 0)
    first = a.export_facts()
    dispatch(a, "r2", 0)
    dispatch(a, "r3", 1)
    second = a.export_facts()
    for facts in (second, first, second):
        b.apply_facts(facts, "a")
    assert await requests(b) == [2, 1, 0]
    complete(a, "r3")
    third = a.export_facts()
    b.apply_facts(third, "a")
    b.apply_facts(second, "a")  # late duplicate of an older fact
    assert await requests(b) == [2, 0, 0]


async def test_a_silent_peer_expires_and_a_restarted_one_replaces_its_old_run() -> None:
    a, b = replicas(cross_replica_state_ttl="3s")
    dispatch(a, "r1", 1)
    sync(a, b)
    at(b, T0 + 2.9)
    assert (await requests(b))[1] == 1
    at(b, T0 + 3.5)  # nothing newer for longer than the TTL: forgotten without any apply
    assert (await requests(b))[1] == 0
    assert b.dump_state()["peers"] == {}
    # The same origin restarted (a later run) with nothing in flight: its first export is full.
    a2 = producer()
    a2._publisher._epoch = a._publisher._epoch + 1
    dispatch(a, "r2", 0)
    sync(a, b)
    at(a2, T0 + 3.5)
    sync(a2, b)
    assert await requests(b) == [0, 0, 0]


async def test_no_echo_and_own_facts_are_ignored() -> None:
    a, b = replicas()
    dispatch(a, "r1", 0)
    sync(a, b)
    assert all(not f["loads"] for f in b.export_facts())  # b has nothing of its own
    dispatch(b, "rb", 2)
    own = b.export_facts()
    b.apply_facts(own, "b-again")  # its own facts coming back
    assert await requests(b) == [1, 0, 1]


async def test_the_estimate_adds_peer_changes_since_the_scrape_once() -> None:
    a, b = replicas()
    at(a, T0 - 0.5)
    at(b, T0 - 0.5)
    dispatch(a, "before", 0)
    sync(a, b)  # known here before the scrape at T0: the scrape counts it
    at(a, T0 + 0.1)
    at(b, T0 + 0.1)
    dispatch(a, "after-1", 0)
    dispatch(a, "after-2", 0)
    sync(a, b)  # heard of after the scrape
    ep = make_endpoint(0, queue=4, update_time=T0)
    assert await estimate(b, ep) == 4 + 2
    newer = make_endpoint(0, queue=6, update_time=T0 + 0.15)  # has seen them: no double count
    assert await estimate(b, newer) == 6
    at(a, T0 + 0.2)
    at(b, T0 + 0.2)
    complete(a, "before")
    sync(a, b)
    assert await estimate(b, newer) == 5  # a peer completion since the scrape
    stale = make_endpoint(0, queue=9, update_time=T0 - 10)
    assert await estimate(b, stale) == 2  # no usable scrape: every replica's in-flight count


async def estimate(p: InflightLoadProducer, ep: Any) -> float:
    request = make_request()
    await p.produce(request, [ep])
    return LOAD_ESTIMATE.key(p.typed_name.name).get(request)[ep.id]


async def test_sharing_can_be_turned_off() -> None:
    a, b = replicas(sync_cross_replica_state=False)
    dispatch(a, "r1", 0)
    assert a.export_facts() == []
    b.apply_facts(producer().export_facts(), "c")
    dispatch(producer(), "x", 0)
    assert await requests(b) == [0, 0, 0]


async def test_bounds_dirty_overflow_chunked_refresh_and_malformed_facts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(inflight_peers, "MAX_DIRTY", 2)
    monkeypatch.setattr(inflight_peers, "MAX_FACT_ENDPOINTS", 2)
    a, b = replicas()
    a.export_facts()
    eps = [make_endpoint(i) for i in range(5)]
    for i, ep in enumerate(eps):
        dispatch_to(a, f"r{i}", ep)
    facts = a.export_facts()  # more changes than remembered: a full refresh, in chunks
    assert [len(f["loads"]) for f in facts] == [2, 2, 1]
    assert not any(f["full"] for f in facts)  # too big for one fact: partial updates
    b.apply_facts(facts, "a")
    assert len(b.dump_state()["peerLoad"]) == 5
    bad: list[Any] = [
        None,
        {"src": "x", "v": [1, 1], "full": True},
        {"src": "x", "v": [1], "full": True, "loads": {}},
        {"src": "x", "v": [1, 2], "full": True, "loads": {"e": [1]}},
        {"src": "x", "v": [1, 3], "full": "yes", "loads": {}},
        {"src": "x", "v": [1, 4], "full": False, "loads": {"e": [-1, 0]}},
        {"src": "x", "v": [1, 5], "full": False, "loads": {"a": [1, 0], "b": [1, 0], "c": [1, 0]}},
    ]
    b.apply_facts(bad, "a")
    assert len(b.dump_state()["peerLoad"]) == 5


def dispatch_to(p: InflightLoadProducer, rid: str, ep: Any) -> None:
    p.pre_request(make_request(request_id=rid), SchedulingResult({"d": ProfileResult((ep,))}, "d"))


def test_peer_origins_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inflight_peers, "MAX_ORIGINS", 2)
    b = producer()
    for i in range(4):
        a = producer()
        dispatch(a, "r", 0)
        b.apply_facts(a.export_facts(), f"origin-{i}")
    assert len(b.dump_state()["peers"]) == 2
    assert b.dump_state()["peerLoad"] == {EPS[0].id: [2, 0]}


def test_parameters() -> None:
    p = producer(cross_replica_refresh_interval="500ms", cross_replica_state_ttl="2s")
    assert (p.params.refresh_seconds, p.params.ttl_seconds) == (0.5, 2.0)
    with pytest.raises(ValueError, match="crossReplicaStateTtl"):
        producer(cross_replica_refresh_interval="2s", cross_replica_state_ttl="2s")
    with pytest.raises(ValueError, match="crossReplicaRefreshInterval"):
        producer(cross_replica_refresh_interval="0s")
    upstream = producer(prefix_match_info_producer_name="precise-prefix-cache-producer")
    assert upstream._prefix_key == "PrefixCacheMatchInfo/precise-prefix-cache-producer"
