"""Pluggable in-flight eviction: the eviction filter policy decides at dispatch which requests may
be evicted, the eviction ordering policy which goes first (epp.flowcontrol.eviction)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import pytest

from epp.flowcontrol.config import FlowControlConfigError
from epp.plugin import PluginBase
from epp.plugin.flow import EvictionItem
from epp.plugins.flow.eviction import PriorityThenTimeEvictionOrderPolicy
from filters.sheddable_eviction import SheddableEvictionFilter
from tests.builders import FakeHandle
from tests.unit.flowcontrol.flow_builders import make_env, request

EVICTION = "flow-control/eviction"


class EverythingBelowTen(PluginBase):
    """A filter accepting any request of priority < 10, not just sheddable ones."""

    TYPE: ClassVar[str] = "test-everything-below-ten"

    def evictable(self, item: EvictionItem) -> bool:
        return item.priority < 10


class OldestFirst(PluginBase):
    """An ordering evicting the earliest dispatched first."""

    TYPE: ClassVar[str] = "test-oldest-first"

    def eviction_key(self, item: EvictionItem) -> tuple[float, ...]:
        return (item.dispatched_at, item.seq)


class Broken(PluginBase):
    TYPE: ClassVar[str] = "test-broken"

    def evictable(self, item: EvictionItem) -> bool:
        raise RuntimeError("broken")


def _built(*plugins: type[PluginBase]) -> dict[str, Any]:
    return {p.TYPE: p(name=p.TYPE, params=None, handle=FakeHandle()) for p in plugins}


async def _dispatch(env: Any, *requests: Any) -> None:
    for req in requests:
        await env.controller.admit(req, env.pool.endpoints)
        env.advance(0.01)


async def test_the_defaults_are_upstreams_sheddable_filter_and_priority_then_time() -> None:
    env = make_env({"enableEviction": True})
    assert isinstance(env.plugins["sheddable-eviction-filter"], SheddableEvictionFilter)
    policy = env.plugins["priority-then-time-eviction-order-policy"]
    assert isinstance(policy, PriorityThenTimeEvictionOrderPolicy)
    low_old, low_new, high = (
        request("a", priority=-2),
        request("b", priority=-2),
        request("c", priority=-1),
    )
    await _dispatch(env, low_old, high, low_new)
    env.pool.saturation = 1.0
    waiting = asyncio.create_task(env.controller.admit(request("urgent"), env.pool.endpoints))
    await asyncio.sleep(0)
    # one revocation: the lowest priority, and of those the most recently dispatched
    assert [r.request_id for r in (low_old, low_new, high) if r.attributes[EVICTION].evicted] == [
        "b"
    ]
    waiting.cancel()


async def test_a_declared_filter_and_ordering_replace_the_defaults() -> None:
    env = make_env({"enableEviction": True}, built=_built(EverythingBelowTen, OldestFirst))
    assert "sheddable-eviction-filter" not in env.plugins  # nothing added next to them
    assert "priority-then-time-eviction-order-policy" not in env.plugins
    first, second = request("first", priority=0), request("second", priority=0)
    protected = request("protected", priority=10)
    await _dispatch(env, first, second, protected)
    assert EVICTION not in protected.attributes  # the filter refused it at dispatch
    env.pool.saturation = 1.0
    waiting = asyncio.create_task(
        env.controller.admit(request("urgent", priority=20), env.pool.endpoints)
    )
    await asyncio.sleep(0)
    # priority-0 requests are victims now, the oldest first
    assert first.attributes[EVICTION].evicted and not second.attributes[EVICTION].evicted
    waiting.cancel()


async def test_a_filter_that_raises_keeps_the_request(caplog: pytest.LogCaptureFixture) -> None:
    env = make_env({"enableEviction": True}, built=_built(Broken))
    victim = request("v", priority=-1)
    with caplog.at_level(logging.ERROR):
        await _dispatch(env, victim)
    assert EVICTION not in victim.attributes
    assert "eviction filter policy" in caplog.text


def test_two_filters_are_a_configuration_error() -> None:
    with pytest.raises(FlowControlConfigError, match="exactly one eviction filter policy, got 2"):
        make_env(
            {"enableEviction": True},
            built=_built(EverythingBelowTen, SheddableEvictionFilter),
        )


def test_without_eviction_no_policy_is_needed() -> None:
    env = make_env(
        {"enableEviction": False}, built=_built(EverythingBelowTen, SheddableEvictionFilter)
    )
    assert env.controller is not None
