"""The flow controller across EPP replicas (``SharedState``): per-band occupancy shared and shown
in metrics; behaviour unchanged by default; the opt-in pool-wide gates (priority, maxRequests);
duplicates, reordering, heartbeat, expiry of a silent peer, no echo, bounds."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from epp.flowcontrol import shared
from epp.flowcontrol.shared import FLOW_CONTROL_NAME, CrossReplicaOptions
from epp.plugin import ErrorCode, InferenceError, SharedState
from tests.unit.flowcontrol.flow_builders import Env, make_env, request

QUEUE = "llm_d_epp_flow_control_cross_replica_queue_size"
PEERS = "llm_d_epp_flow_control_cross_replica_peers"


async def enqueue(env: Env, rid: str, priority: int = 0) -> asyncio.Task[None]:
    task = asyncio.create_task(
        env.controller.admit(request(rid, priority=priority), env.pool.endpoints)
    )
    await asyncio.sleep(0)
    return task


def sync(source: Env, target: Env, origin: str = "replica-a") -> list[Any]:
    facts = json.loads(json.dumps(source.controller.export_facts()))
    target.controller.apply_facts(facts, origin)
    return facts


async def busy_peer(n: int = 2, priority: int = 10, **kw: Any) -> tuple[Env, list[Any]]:
    """A replica whose pool is saturated, with ``n`` requests queued in band ``priority``."""
    peer = make_env(**kw)
    peer.pool.saturation = 1.0
    tasks = [await enqueue(peer, f"p{i}", priority) for i in range(n)]
    return peer, tasks


def cancel(tasks: list[Any]) -> None:
    for t in tasks:
        t.cancel()


async def test_controller_is_shared_state_named_flow_control() -> None:
    env = make_env()
    assert isinstance(env.controller, SharedState)
    assert env.controller.typed_name == FLOW_CONTROL_NAME
    assert str(FLOW_CONTROL_NAME) == "flow-control/flow-control"


async def test_peers_queued_requests_show_in_the_cross_replica_gauges() -> None:
    peer, tasks = await busy_peer(3)
    env = make_env()
    env.pool.saturation = 1.0
    mine = await enqueue(env, "m", 10)
    facts = sync(peer, env)
    assert [f["bands"] for f in facts] == [{"10": [3, 300]}]
    assert env.metric(QUEUE, priority="10", inference_pool="pool") == 4.0
    assert env.metric(QUEUE, priority="0", inference_pool="pool") == 0.0
    assert env.metric(PEERS, inference_pool="pool") == 1.0
    cancel([*tasks, mine])


async def test_by_default_a_peers_higher_band_holds_nothing() -> None:
    peer, tasks = await busy_peer()
    env = make_env()
    sync(peer, env)
    env.pool.saturation = 0.5
    await asyncio.wait_for(env.controller.admit(request("low"), env.pool.endpoints), 1.0)
    cancel(tasks)


async def test_pool_wide_priority_holds_a_lower_band_while_a_peer_queues_a_higher_one() -> None:
    peer, tasks = await busy_peer()
    env = make_env(cross_replica=CrossReplicaOptions(pool_wide_priority=True))
    sync(peer, env)
    env.pool.saturation = 0.5  # room in the pool: without the peer it would dispatch at once
    low = await enqueue(env, "low")
    top = await enqueue(env, "top", 10)  # equal priority competes as before
    await asyncio.wait_for(top, 1.0)
    assert not low.done() and env.controller.queued() == 1
    cancel(tasks)  # the peer's band drains ...
    await asyncio.sleep(0)
    sync(peer, env)  # ... and says so
    assert env.controller.step() is True
    await asyncio.wait_for(low, 1.0)


async def test_a_silent_peer_stops_holding_after_its_ttl() -> None:
    peer, tasks = await busy_peer()
    options = CrossReplicaOptions(pool_wide_priority=True, peer_ttl=3.0)
    env = make_env(cross_replica=options)
    sync(peer, env)
    env.pool.saturation = 0.5
    low = await enqueue(env, "low")
    env.advance(2.9)
    assert env.controller.step() is False
    env.advance(0.2)  # nothing newer from it for more than 3 s: forgotten, no apply needed
    assert env.controller.step() is True
    await asyncio.wait_for(low, 1.0)
    env.controller.export_facts()  # the next sync round sets the gauges
    assert env.metric(PEERS, inference_pool="pool") == 0.0
    cancel(tasks)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"maxRequests": 3}, id="global"),
        pytest.param({"defaultPriorityBand": {"maxRequests": "3"}}, id="band"),
    ],
)
async def test_pool_wide_max_requests_counts_the_peers_queued_requests(
    config: dict[str, Any],
) -> None:
    peer, tasks = await busy_peer(2, priority=0)
    env = make_env(config, cross_replica=CrossReplicaOptions(pool_wide_max_requests=True))
    alone = make_env(config)
    sync(peer, env)
    sync(peer, alone)
    for e in (env, alone):
        e.pool.saturation = 1.0
    queued = [await enqueue(env, "a"), await enqueue(alone, "a"), await enqueue(alone, "b")]
    with pytest.raises(InferenceError) as info:
        await asyncio.wait_for(env.controller.admit(request("b"), env.pool.endpoints), 1.0)
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert not any(t.done() for t in queued)  # per replica (the default): room for 3 each
    cancel([*tasks, *queued])


async def test_duplicates_and_reordered_facts_change_nothing() -> None:
    peer, tasks = await busy_peer(1)
    env = make_env()
    first = peer.controller.export_facts()
    tasks.append(await enqueue(peer, "p-more", 10))
    second = peer.controller.export_facts()
    for facts in (second, second, first):  # duplicated, then the older one arrives last
        env.controller.apply_facts(facts, "a")
    assert env.metric(QUEUE, priority="10", inference_pool="pool") == 2.0
    cancel(tasks)


async def test_unchanged_occupancy_is_re_sent_only_as_a_heartbeat() -> None:
    peer, tasks = await busy_peer(1)
    assert len(peer.controller.export_facts()) == 1
    assert peer.controller.export_facts() == []
    peer.advance(1.0)
    assert len(peer.controller.export_facts()) == 1
    cancel(tasks)


async def test_no_echo_and_own_facts_are_ignored() -> None:
    peer, tasks = await busy_peer(2)
    env = make_env()
    sync(peer, env)
    assert [f["bands"] for f in env.controller.export_facts()] == [{}]  # its own: nothing queued
    own = peer.controller.export_facts() or []
    peer.advance(1.0)
    own += peer.controller.export_facts()
    peer.controller.apply_facts(own, "peer-again")
    assert peer.metric(QUEUE, priority="10", inference_pool="pool") == 2.0
    cancel(tasks)


async def test_malformed_facts_and_too_many_peers_are_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shared, "MAX_PEERS", 1)
    env = make_env()
    bad: list[Any] = [
        None,
        {"src": "x", "v": [1, 1]},
        {"src": "x", "v": [1, 2], "bands": {"ten": [1, 1]}},
        {"src": "x", "v": [1, 3], "bands": {"10": [1]}},
        {"src": "x", "v": [1, 4], "bands": {"10": [-1, 0]}},
        {"src": "x", "v": "1", "bands": {}},
    ]
    env.controller.apply_facts(bad, "a")
    good = {"src": "y", "v": [1, 1], "bands": {"5": [1, 10]}}
    env.controller.apply_facts([good], "b")
    env.controller.apply_facts([{**good, "src": "z"}], "c")  # a second peer: over the cap
    assert env.metric(QUEUE, priority="5", inference_pool="pool") == 1.0
    assert env.metric(PEERS, inference_pool="pool") == 1.0


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        CrossReplicaOptions(peer_ttl=1.0, heartbeat=1.0)
