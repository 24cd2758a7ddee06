"""Each flow-policy and data-layer check of the contract kit rejects a deliberately broken toy
plugin, with a message naming the broken rule, and passes a well-behaved one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from epp.plugin import Endpoint, Metrics, PluginBase
from epp.plugin.flow import QueuedRequest
from epp.plugin.testing import (
    check_data_source,
    check_discovery,
    check_endpoint_listener,
    check_extractor,
    check_fairness_policy,
    check_ordering_policy,
    check_priority_adjuster,
    check_replica_syncer,
    check_shared_state,
    check_usage_limit_policy,
    sample_endpoints,
    sample_queue,
    sample_request,
)

EP = sample_endpoints(1)[0]


def toy(cls: type[Any]) -> Any:
    return cls(name="toy", params=None, handle=None)


class Fcfs(PluginBase):
    TYPE = "toy-fcfs"

    def order_key(self, item: QueuedRequest) -> tuple[float, ...]:
        return (item.enqueue_time, float(item.seq))


class TiedOrder(Fcfs):
    def order_key(self, item: QueuedRequest) -> tuple[float, ...]:
        return (0.0,)


class StringOrder(Fcfs):
    def order_key(self, item: QueuedRequest) -> tuple[Any, ...]:
        return (item.request.request_id,)


def test_ordering_checks() -> None:
    check_ordering_policy(toy(Fcfs), sample_queue(5))
    with pytest.raises(AssertionError, match="two requests have the same order key"):
        check_ordering_policy(toy(TiedOrder), sample_queue(5))
    with pytest.raises(AssertionError, match="non-numeric key"):
        check_ordering_policy(toy(StringOrder), sample_queue(5))


class RoundRobin(PluginBase):
    TYPE = "toy-rr"

    def new_state(self) -> Any:
        return {"last": -1}

    def select_flow(self, band: Any, now: float) -> Any:
        flows = list(band.active_flows())
        if not flows:
            return None
        return flows[(band.state["last"] + 1) % len(flows)]

    def on_dispatch(self, band: Any, flow: Any, item: Any, now: float) -> None:
        band.state["last"] = list(band.active_flows()).index(flow) if len(flow) else -1

    def on_complete(self, fairness_id: str, tokens_in: int, tokens_out: int, now: float) -> None:
        return None


class MovesOnSelect(RoundRobin):
    def select_flow(self, band: Any, now: float) -> Any:
        band.state["last"] += 1
        flows = list(band.active_flows())
        return flows[band.state["last"] % len(flows)] if flows else None


class SharedCounter(RoundRobin):
    """Each new band starts where the previous one's instance count says: two bands disagree."""

    bands = 0

    def new_state(self) -> Any:
        self.bands += 1
        return {"last": self.bands}


class PicksEmpty(RoundRobin):
    def select_flow(self, band: Any, now: float) -> Any:
        return band.flows[0]


def test_fairness_checks() -> None:
    queues = [sample_queue(2, fairness_id=f) for f in "abc"]
    check_fairness_policy(toy(RoundRobin), toy(Fcfs), queues)
    with pytest.raises(AssertionError, match="select_flow\\(\\) moved state"):
        check_fairness_policy(toy(MovesOnSelect), toy(Fcfs), queues)
    with pytest.raises(AssertionError, match="dispatch order differs"):
        check_fairness_policy(toy(SharedCounter), toy(Fcfs), queues)
    with pytest.raises(AssertionError, match="not a non-empty flow"):
        check_fairness_policy(toy(PicksEmpty), toy(Fcfs), queues)


class Limits(PluginBase):
    TYPE = "toy-limits"
    values: Callable[[float, int], list[float]] = staticmethod(lambda s, n: [1.0] * n)

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return type(self).values(saturation, len(priorities))


class Increasing(Limits):
    values = staticmethod(lambda s, n: [i / n for i in range(n)])


class Above(Limits):
    values = staticmethod(lambda s, n: [1.5] * n)


class Adjuster(PluginBase):
    TYPE = "toy-adjuster"

    def adjusted_priority(self, request: Any, now: float) -> Any:
        return "high"

    def on_dispatch(self, request: Any, now: float) -> None: ...

    def on_done(self, request: Any, now: float) -> None: ...


def test_usage_limit_and_adjuster_checks() -> None:
    check_usage_limit_policy(toy(Limits), [2, 1, 0])
    with pytest.raises(AssertionError, match="increasing"):
        check_usage_limit_policy(toy(Increasing), [2, 1, 0])
    with pytest.raises(AssertionError, match=r"ceiling outside \[0, 1\]"):
        check_usage_limit_policy(toy(Above), [2, 1, 0])
    with pytest.raises(AssertionError, match="adjusted_priority\\(\\) returned 'high'"):
        check_priority_adjuster(toy(Adjuster), sample_request())


class HangingSource(PluginBase):
    TYPE = "toy-source"

    async def poll(self, endpoint: Endpoint) -> bytes:
        await asyncio.Event().wait()  # never set: the check's bound must end it
        return b""


class TextSource(HangingSource):
    async def poll(self, endpoint: Endpoint) -> Any:
        return "text, not bytes"


class Extractor(PluginBase):
    TYPE = "toy-extractor"

    def extract(self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float) -> Any:
        return {"waiting": 1}


class EndpointHearer(PluginBase):
    TYPE = "toy-hearer"

    def extract_endpoint(self, event: Any) -> Any:
        return ["not", "a", "mapping"]


async def test_data_layer_checks() -> None:
    with pytest.raises(AssertionError, match=r"poll\(\) did not end within 0\.05 s"):
        await check_data_source(toy(HangingSource), EP, bound=0.05)
    with pytest.raises(AssertionError, match="poll\\(\\) returned str"):
        await check_data_source(toy(TextSource), EP)
    with pytest.raises(AssertionError, match="extract\\(\\) returned dict"):
        check_extractor(toy(Extractor), b"", EP)
    with pytest.raises(AssertionError, match="extract_endpoint\\(\\) returned"):
        check_endpoint_listener(toy(EndpointHearer), EP)


class Discovery(PluginBase):
    TYPE = "toy-discovery"

    async def run(self, publish: Callable[[Sequence[Endpoint]], None]) -> None:
        publish([EP])
        await asyncio.Event().wait()


class MuteDiscovery(Discovery):
    async def run(self, publish: Callable[[Sequence[Endpoint]], None]) -> None:
        await asyncio.Event().wait()


class Syncer(PluginBase):
    TYPE = "toy-syncer"
    replica_id = "r-1"
    bootstrap_timeout = 1.0

    def bind(self, pool: str) -> None: ...

    async def publish(self, batch: Any) -> None:
        raise ConnectionError("transport down")  # degraded: allowed

    async def replay(self) -> Any:
        return []

    async def receive(self, wait: float = 0.0) -> Any:
        await asyncio.Event().wait()


class Shared(PluginBase):
    TYPE = "toy-shared"

    def export_facts(self) -> Any:
        return ("a", "tuple")

    def apply_facts(self, facts: Any, origin: str) -> None: ...


async def test_discovery_syncer_and_shared_state_checks() -> None:
    assert await check_discovery(toy(Discovery)) == [EP]
    with pytest.raises(AssertionError, match=r"published no endpoint set within 0\.05 s"):
        await check_discovery(toy(MuteDiscovery), bound=0.05)
    with pytest.raises(AssertionError, match=r"receive\(\) did not end in 0\.05 s"):
        await check_replica_syncer(toy(Syncer), bound=0.05)
    with pytest.raises(AssertionError, match="export_facts\\(\\) returned"):
        check_shared_state(toy(Shared), toy(Shared))
