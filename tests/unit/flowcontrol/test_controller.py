from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from epp.flowcontrol.controller import FlowController
from epp.plugin import DropReason, Endpoint, ErrorCode, InferenceError, InferenceRequest
from tests.unit.flowcontrol.flow_builders import Env, make_env, request

Task = asyncio.Task[None]


async def _enqueue(
    env: Env, req: InferenceRequest, candidates: Callable[[], Sequence[Endpoint]] | None = None
) -> Task:
    """Start ``admit`` and let it run up to its wait (or to its result)."""
    task = asyncio.create_task(env.controller.admit(req, candidates or env.pool.endpoints))
    await asyncio.sleep(0)
    return task


async def _error_of(task: Task) -> InferenceError:
    with pytest.raises(InferenceError) as info:
        await asyncio.wait_for(task, timeout=1.0)
    return info.value


def _ids(tasks: dict[str, Task]) -> set[str]:
    return {rid for rid, t in tasks.items() if t.done()}


async def _drain(env: Env, tasks: dict[str, Task], steps: int) -> list[str]:
    """Run ``steps`` dispatch cycles; the request ids in the order they were dispatched."""
    order: list[str] = []
    for _ in range(steps):
        before = _ids(tasks)
        env.controller.step()
        await asyncio.sleep(0)
        order += sorted(_ids(tasks) - before)
    return order


# ---- dispatch and gating ------------------------------------------------------------------


async def test_request_dispatched_at_once_when_pool_has_room() -> None:
    env = make_env()
    env.pool.saturation = 0.5
    await env.controller.admit(request(), env.pool.endpoints)
    assert env.controller.in_flight() == 1
    assert env.controller.queued() == 0
    labels = {"outcome": "Dispatched", "priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_requests_total", **labels) == 1.0


async def test_request_waits_when_saturated_then_dispatches_when_room() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    env.controller.step()
    await asyncio.sleep(0)
    assert not task.done() and env.controller.queued() == 1
    env.pool.saturation = 0.99
    assert env.controller.step() is True
    await task
    assert env.controller.queued() == 0


async def test_higher_band_dispatches_first_when_several_bands_wait() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    tasks = {}
    for rid, prio in [("low", -1), ("mid", 0), ("high-a", 5), ("top", 9), ("high-b", 5)]:
        tasks[rid] = await _enqueue(env, request(rid, priority=prio))
    assert env.controller.priorities() == [9, 5, 0, -1]
    env.pool.saturation = 0.1
    assert await _drain(env, tasks, 5) == ["top", "high-a", "high-b", "mid", "low"]


async def test_lower_bands_held_back_when_saturation_above_their_ceiling() -> None:
    env = make_env(
        {"usageLimitPolicyPluginRef": "holdback", "priorityBands": [{"priority": 5}]},
        plugins=[("priority-holdback-policy", "holdback", {"minCeiling": 0.5})],
    )
    env.pool.saturation = 1.0
    tasks = {
        "low": await _enqueue(env, request("low")),
        "high": await _enqueue(env, request("high", priority=5)),
    }
    env.pool.saturation = 0.6  # ceilings: band 5 -> 1.0, band 0 -> 0.5
    assert await _drain(env, tasks, 3) == ["high"]
    env.pool.saturation = 0.49
    assert await _drain(env, tasks, 1) == ["low"]


async def test_cycle_stops_at_gated_band_when_static_threshold_reached() -> None:
    env = make_env(plugins=[("static-usage-limit-policy", "", {"threshold": 0.5})])
    env.pool.saturation = 0.5
    task = await _enqueue(env, request(priority=10))
    assert not task.done()
    env.pool.saturation = 0.49
    env.controller.step()
    await task


@pytest.mark.parametrize(
    ("fairness", "expected"),
    [
        pytest.param("global-strict-fairness-policy", ["a1", "a2", "a3", "b1"], id="global-fcfs"),
        pytest.param("round-robin-fairness-policy", ["a1", "b1", "a2", "a3"], id="round-robin"),
    ],
)
async def test_fairness_policy_orders_flows_when_band_shared(
    fairness: str, expected: list[str]
) -> None:
    env = make_env(
        {"defaultPriorityBand": {"fairnessPolicyRef": fairness}},
        plugins=[(fairness, "", {})],
    )
    env.pool.saturation = 1.0
    tasks = {}
    for rid in ["a1", "a2", "a3", "b1"]:
        env.advance(0.01)
        tasks[rid] = await _enqueue(env, request(rid, fairness=rid[0]))
    env.pool.saturation = 0.0
    assert await _drain(env, tasks, 4) == expected


async def test_run_loop_dispatches_when_saturation_drops() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    runner = asyncio.create_task(env.controller.run())
    try:
        task = await _enqueue(env, request())
        await asyncio.sleep(0.01)
        assert not task.done()
        env.pool.saturation = 0.2
        await asyncio.wait_for(task, timeout=2.0)
    finally:
        runner.cancel()
        with pytest.raises(asyncio.CancelledError):
            await runner


# ---- TTL and endpoints --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waited", "expired"),
    [pytest.param(9.5, False, id="within-ttl"), pytest.param(10.0, True, id="ttl-reached")],
)
async def test_queued_request_expires_with_429_when_ttl_passes(
    waited: float, expired: bool
) -> None:
    env = make_env({"defaultRequestTTL": "10s"})
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    env.advance(waited)
    env.controller.step()
    await asyncio.sleep(0)
    assert task.done() is expired
    if not expired:
        task.cancel()
        return
    err = await _error_of(task)
    assert err.code is ErrorCode.RESOURCE_EXHAUSTED
    assert err.drop_reason == DropReason.TTL_EXPIRED
    labels = {"outcome": "EvictedTTL", "priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_requests_total", **labels) == 1.0


async def test_request_never_expires_when_ttl_disabled() -> None:
    env = make_env({"defaultRequestTTL": "0s"})
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    env.advance(3600)
    env.controller.step()
    await asyncio.sleep(0)
    assert not task.done()
    task.cancel()


async def test_request_gets_503_when_no_endpoint_ttl_passes_with_empty_pool() -> None:
    env = make_env({"defaultRequestTTL": "60s", "noEndpointRequestTTL": "5s"})
    env.pool.size = 0
    task = await _enqueue(env, request())
    env.advance(5)
    env.controller.step()
    err = await _error_of(task)
    assert err.code is ErrorCode.SERVICE_UNAVAILABLE
    assert err.drop_reason == DropReason.NO_ENDPOINTS
    labels = {"outcome": "EvictedNoEndpoints", "priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_requests_total", **labels) == 1.0


async def test_no_endpoint_budget_starts_at_regime_change_when_endpoints_vanish() -> None:
    env = make_env({"defaultRequestTTL": "10s", "noEndpointRequestTTL": "5s"})
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    env.advance(8)
    env.pool.size = 0  # endpoints vanish at t+8: the 5 s budget runs from there
    env.controller.step()
    env.advance(4.9)
    env.controller.step()
    await asyncio.sleep(0)
    assert not task.done()
    env.advance(0.1)
    env.controller.step()
    assert (await _error_of(task)).drop_reason == DropReason.NO_ENDPOINTS


async def test_waiting_room_dispatches_when_endpoints_appear() -> None:
    env = make_env({"noEndpointRequestTTL": "30s"})
    env.pool.size = 0
    task = await _enqueue(env, request())
    env.advance(10)
    env.controller.step()
    await asyncio.sleep(0)
    assert not task.done(), "no endpoints: the request waits"
    assert env.controller.queued() == 1
    env.pool.size = 2
    env.controller.step()
    await asyncio.wait_for(task, timeout=1.0)
    assert env.controller.in_flight() == 1
    assert env.controller.queued() == 0


# ---- capacity -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "sizes"),
    [
        pytest.param(
            {"priorityBands": [{"priority": 0, "maxRequests": "2"}]}, [1, 1, 1], id="band-requests"
        ),
        pytest.param(
            {"priorityBands": [{"priority": 0, "maxBytes": "1k"}]}, [600, 400, 1], id="band-bytes"
        ),
        pytest.param({"maxRequests": 2}, [1, 1, 1], id="global-requests"),
        pytest.param({"maxBytes": "1Ki"}, [1000, 24, 1], id="global-bytes"),
        pytest.param({"defaultPriorityBand": {"maxRequests": "2"}}, [1, 1, 1], id="template"),
    ],
)
async def test_request_rejected_with_429_when_queue_full(
    config: dict[str, Any], sizes: list[int]
) -> None:
    env = make_env(config)
    env.pool.saturation = 1.0
    queued = [await _enqueue(env, request(f"r{i}", size=s)) for i, s in enumerate(sizes[:-1])]
    with pytest.raises(InferenceError) as info:
        await env.controller.admit(request("last", size=sizes[-1]), env.pool.endpoints)
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.drop_reason == DropReason.SATURATED
    assert info.value.message == "request rejected pre-queue: queue at capacity"
    assert not any(t.done() for t in queued)
    for t in queued:
        t.cancel()


async def test_request_rejected_with_503_when_queue_full_and_no_endpoints() -> None:
    env = make_env({"maxRequests": 1})
    env.pool.size = 0
    first = await _enqueue(env, request("a"))
    with pytest.raises(InferenceError) as info:
        await env.controller.admit(request("b"), env.pool.endpoints)
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert info.value.drop_reason == DropReason.NO_ENDPOINTS
    first.cancel()


async def test_sheddable_band_uses_negative_template_when_configured() -> None:
    env = make_env({"defaultNegativePriorityBand": {"maxRequests": "1"}})
    env.pool.saturation = 1.0
    await _enqueue(env, request("s1", priority=-3))
    with pytest.raises(InferenceError, match="queue at capacity"):
        await env.controller.admit(request("s2", priority=-3), env.pool.endpoints)
    protected = [await _enqueue(env, request(f"p{i}", priority=4)) for i in range(3)]
    assert env.controller.queued(4) == 3 and env.controller.queued(-3) == 1
    assert all(not t.done() for t in protected)


async def test_dynamic_band_collected_when_idle_long_enough() -> None:
    env = make_env()
    await env.controller.admit(request(priority=7), env.pool.endpoints)
    assert env.controller.priorities() == [7, 0]
    env.advance(599)
    env.controller.step()
    assert env.controller.priorities() == [7, 0]
    cap = {"priority": "7", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_capacity_utilization_requests", **cap) == 0.0
    env.advance(1)
    env.controller.step()
    assert env.controller.priorities() == [0]
    assert env.metric("llm_d_epp_flow_control_capacity_utilization_requests", **cap) is None


# ---- client cancel, done, shutdown --------------------------------------------------------


async def test_slot_freed_when_client_cancels_while_queued() -> None:
    env = make_env({"maxRequests": 1})
    env.pool.saturation = 1.0
    task = await _enqueue(env, request("gone"))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.controller.queued() == 0
    labels = {"outcome": "EvictedContextCancelled", "priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_requests_total", **labels) == 1.0
    queued_labels = {
        "fairness_id": "default-flow",
        "priority": "0",
        "inference_pool": "pool",
        "model_name": "",
        "target_model_name": "",
    }
    assert env.metric("llm_d_epp_flow_control_queue_size", **queued_labels) == 0.0
    nxt = await _enqueue(env, request("next"))  # the freed slot takes a new request
    assert not nxt.done()
    nxt.cancel()


async def test_in_flight_released_when_cancelled_right_after_dispatch() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    env.pool.saturation = 0.0
    env.controller.step()  # dispatched; the task has not resumed yet
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert env.controller.in_flight() == 0


async def test_done_releases_accounting_when_request_finishes() -> None:
    env = make_env(
        {"defaultPriorityBand": {"fairnessPolicyRef": "program-aware-fairness"}},
        plugins=[("program-aware-fairness", "", {}), ("concurrency-detector", "", {})],
        detector="concurrency-detector",
    )
    req = request("r", fairness="agent-1", size=400)  # 100 estimated prompt tokens
    await env.controller.admit(req, env.pool.endpoints)
    detector = env.plugins["concurrency-detector"]
    fairness = env.plugins["program-aware-fairness"]
    assert detector.reserved == (1, 100)
    assert fairness.programs["agent-1"].in_flight == 1
    env.controller.done(req, output_tokens=10)
    assert detector.reserved == (0, 0)
    assert fairness.programs["agent-1"].service == pytest.approx(100 + 2 * 10)
    assert fairness.programs["agent-1"].in_flight == 0
    assert env.controller.in_flight() == 0
    env.controller.done(req, output_tokens=10)  # a second call is a no-op
    assert fairness.programs["agent-1"].service == pytest.approx(120)


async def test_queued_requests_get_503_when_controller_shuts_down() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    task = await _enqueue(env, request())
    await env.controller.shutdown()
    err = await _error_of(task)
    assert err.code is ErrorCode.SERVICE_UNAVAILABLE
    assert err.drop_reason == DropReason.SHUTTING_DOWN
    with pytest.raises(InferenceError) as info:
        await env.controller.admit(request("late"), env.pool.endpoints)
    assert info.value.drop_reason == DropReason.SHUTTING_DOWN
    for outcome in ("EvictedOther", "RejectedOther"):
        labels = {"outcome": outcome, "priority": "0", "inference_pool": "pool"}
        assert env.metric("llm_d_epp_flow_control_requests_total", **labels) == 1.0


# ---- metrics ------------------------------------------------------------------------------


async def test_queue_gauges_track_waiting_requests_when_queued_and_dispatched() -> None:
    env = make_env()
    env.pool.saturation = 1.0
    req = request(size=250, incoming_model="m", target_model="t")
    task = await _enqueue(env, req)
    labels = {
        "fairness_id": "default-flow",
        "priority": "0",
        "inference_pool": "pool",
        "model_name": "m",
        "target_model_name": "t",
    }
    for prefix in ("llm_d_epp", "inference_extension"):
        assert env.metric(f"{prefix}_flow_control_queue_size", **labels) == 1.0
        assert env.metric(f"{prefix}_flow_control_queue_bytes", **labels) == 250.0
    cap = {"priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_capacity_utilization_requests", **cap) == 1 / 5000
    sat = {"inference_pool": "pool", "stage": "effective"}
    assert env.metric("llm_d_epp_flow_control_pool_saturation", **sat) == pytest.approx(1.0)
    assert (
        env.metric("llm_d_epp_flow_control_stale_endpoints", detector="utilization-detector") == 0
    )
    env.advance(1.5)
    env.pool.saturation = 0.0
    env.controller.step()
    await task
    assert env.metric("llm_d_epp_flow_control_queue_size", **labels) == 0.0
    done = dict(labels, outcome="Dispatched")
    assert env.metric("llm_d_epp_flow_control_request_queue_duration_seconds_count", **done) == 1
    assert env.metric("llm_d_epp_flow_control_request_queue_duration_seconds_sum", **done) == 1.5


async def test_fairness_label_folds_to_other_when_over_64_ids() -> None:
    env = make_env()
    for i in range(70):
        await env.controller.admit(request(f"r{i}", fairness=f"tenant-{i}"), env.pool.endpoints)
    base = {
        "priority": "0",
        "outcome": "Dispatched",
        "inference_pool": "pool",
        "model_name": "",
        "target_model_name": "",
    }
    name = "llm_d_epp_flow_control_request_queue_duration_seconds_count"
    assert env.metric(name, fairness_id="tenant-63", **base) == 1
    assert env.metric(name, fairness_id="tenant-64", **base) is None
    assert env.metric(name, fairness_id="other", **base) == 6


# ---- turn priority and eviction -----------------------------------------------------------


async def test_continuation_turn_waits_in_boosted_band_when_session_in_flight() -> None:
    env = make_env(plugins=[("turn-priority", "", {"boost": 3})])
    first = request("t1", headers={"x-session-affinity": "agent-7"})
    await env.controller.admit(first, env.pool.endpoints)
    env.pool.saturation = 1.0
    second = request("t2", headers={"x-session-affinity": "agent-7"})
    fresh = request("n1", headers={"x-session-affinity": "agent-8"})
    tasks = {"t2": await _enqueue(env, second), "n1": await _enqueue(env, fresh)}
    assert env.controller.queued(3) == 1 and env.controller.queued(0) == 1
    assert second.priority == 0
    env.pool.saturation = 0.0
    assert await _drain(env, tasks, 2) == ["t2", "n1"]


async def test_sheddable_in_flight_evicted_when_higher_band_blocked() -> None:
    env = make_env({"enableEviction": True})
    victims = [request("shed-old", priority=-1), request("shed-new", priority=-1)]
    protected = request("keep", priority=0)
    for req in [*victims, protected]:
        await env.controller.admit(req, env.pool.endpoints)
        env.advance(0.01)
    assert "flow-control/eviction" not in protected.attributes
    env.pool.saturation = 1.0
    waiting = await _enqueue(env, request("urgent", priority=0))
    old, new = (v.attributes["flow-control/eviction"] for v in victims)
    # one decision: credit = 1.0 / 3 in flight, target 0 -> one revocation, newest first
    assert new.evicted and not old.evicted
    assert new.error is not None and new.error.code.http_status == 429
    assert new.error.drop_reason == DropReason.EVICTED
    assert new.error.message == "request evicted by flow control"
    issued = {"priority": "0", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_revocations_issued_total", **issued) == 1
    env.controller.step()
    assert not old.evicted  # paced: waits for confirmation of the first revocation
    env.controller.done(victims[1])
    confirmed = {"outcome": "confirmed", "inference_pool": "pool"}
    assert env.metric("llm_d_epp_flow_control_revocations_total", **confirmed) == 1
    env.advance(0.6)  # past the grace period (scrape + staleness + cleanup = 0.5 s)
    env.controller.step()
    assert old.evicted
    waiting.cancel()


async def test_eviction_signal_wakes_waiter_when_fired() -> None:
    env = make_env({"enableEviction": True})
    victim = request("v", priority=-2)
    await env.controller.admit(victim, env.pool.endpoints)
    signal = victim.attributes["flow-control/eviction"]
    watcher = asyncio.create_task(signal.wait())
    env.pool.saturation = 2.0
    other = await _enqueue(env, request("p", priority=1))
    err = await asyncio.wait_for(watcher, 1.0)
    assert err.drop_reason == DropReason.EVICTED
    other.cancel()


def test_controller_builds_from_defaults_when_no_spec() -> None:
    env = make_env(None)
    assert isinstance(env.controller, FlowController)
    assert env.controller.priorities() == [0]
    assert set(env.plugins) >= {
        "fcfs-ordering-policy",
        "global-strict-fairness-policy",
        "static-usage-limit-policy",
    }
