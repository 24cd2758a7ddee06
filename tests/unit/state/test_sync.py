"""The sync loop over an in-memory log: what is published, applied, skipped, dropped, counted."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epp.plugin import Delivery
from epp.state.metrics import SyncMetrics
from epp.state.sync import StateSync, pool_scope
from tests.unit.state.fakes import MemoryLog, MemorySyncer, Notes


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Replica:
    def __init__(self, log: MemoryLog, rid: str, *plugins: Notes, **kw: Any) -> None:
        self.registry = CollectorRegistry()
        self.clock = Clock()
        self.plugins = plugins or (Notes(),)
        self.syncer = MemorySyncer(log, rid, bootstrap_timeout=kw.pop("bootstrap_timeout", 1.0))
        self.sync = StateSync(
            self.syncer,
            self.plugins,
            interval=kw.pop("interval", 0.01),
            metrics=SyncMetrics(self.registry),
            clock=self.clock,
            **kw,
        )
        self.sync.begin()

    @property
    def notes(self) -> Notes:
        return self.plugins[0]

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(f"llm_d_epp_state_sync_{name}", labels)
        return value or 0.0


async def rounds(*replicas: Replica) -> None:
    for r in replicas:
        assert await r.sync.round()


async def test_facts_one_replica_learns_are_applied_by_the_others_not_by_itself() -> None:
    log = MemoryLog()
    a, b, c = Replica(log, "a"), Replica(log, "b"), Replica(log, "c")
    await rounds(a, b, c)
    a.notes.learn(1, 2)
    b.notes.learn({"x": 3})
    await rounds(a, b, c, a)
    assert b.notes.facts_from("a") == [1, 2]
    assert c.notes.facts_from("a") == [1, 2]
    assert c.notes.facts_from("b") == [{"x": 3}]
    assert a.notes.facts_from("b") == [{"x": 3}]
    assert a.notes.facts_from("a") == []
    assert a.metric("published_facts_total", plugin_name="notes") == 2
    assert a.metric("skipped_facts_total", reason="own_origin") == 2
    assert c.metric("applied_facts_total", plugin_name="notes") == 3
    assert c.metric("batches_total", direction="received") == 2
    assert a.metric("bootstrapped") == 1


class SlowNotes(Notes):
    """Applying takes a known time, as a large prefix fact does."""

    def apply_facts(self, facts: Any, origin: str) -> None:
        until = time.thread_time() + 0.02
        while time.thread_time() < until:  # CPU time, as the metric counts it
            pass
        super().apply_facts(facts, origin)


async def test_the_time_spent_applying_other_replicas_facts_is_counted_by_plugin() -> None:
    log = MemoryLog()
    a, b = Replica(log, "a"), Replica(log, "b", SlowNotes())
    await rounds(a, b)
    assert b.metric("apply_seconds_total", plugin_name="notes") == 0.0
    a.notes.learn(1)
    await rounds(a, b)
    assert 0.02 <= b.metric("apply_seconds_total", plugin_name="notes") < 1.0
    assert a.metric("apply_seconds_total", plugin_name="notes") == 0.0  # its own: not applied


async def test_facts_for_a_plugin_this_replica_lacks_are_skipped_and_counted() -> None:
    log = MemoryLog()
    a, b = Replica(log, "a", Notes("x")), Replica(log, "b", Notes("y"))
    await rounds(a, b)
    a.notes.learn(1, 2, 3)
    await rounds(a, b)
    assert b.notes.applied == []
    assert b.metric("skipped_facts_total", reason="unknown_plugin") == 3


async def test_outage_keeps_the_newest_facts_in_a_bounded_outbox_then_publishes_them() -> None:
    log = MemoryLog()
    a, b = Replica(log, "a", outbox_facts=30), Replica(log, "b")
    await rounds(a, b)
    log.down = True
    for i in range(10):
        a.notes.learn(*range(i * 10, i * 10 + 10))
        a.clock.now += 0.5
        assert not await a.sync.round()
    assert a.sync.outbox_size == 30
    assert a.metric("outbox_facts") == 30
    assert a.metric("dropped_facts_total", plugin_name="notes") == 70
    assert a.metric("errors_total", operation="publish") == 10
    assert a.metric("lag_seconds") == pytest.approx(5.0)
    log.down = False
    await rounds(a, b)
    assert b.notes.facts_from("a") == list(range(70, 100))
    assert a.sync.outbox_size == 0
    assert a.metric("lag_seconds") == 0


async def test_a_round_publishes_the_outbox_in_at_most_four_bounded_entries() -> None:
    log = MemoryLog()
    a = Replica(log, "a", publish_facts=25)
    await rounds(a)
    log.down = True
    for i in range(10):
        a.notes.learn(*range(i * 10, i * 10 + 10))
        await a.sync.round()
    log.down = False
    await rounds(a)
    assert [len(b["notes"]) for b in a.syncer.published] == [20, 20, 20, 20]
    await rounds(a)
    assert [len(b["notes"]) for b in a.syncer.published][4:] == [20]
    assert [f for b in a.syncer.published for f in b["notes"]] == list(range(100))


async def test_receive_failure_counts_and_lag_grows_until_the_log_answers() -> None:
    log = MemoryLog()
    a = Replica(log, "a")
    await rounds(a)
    log.down = True
    a.clock.now += 3
    assert not await a.sync.round()
    assert a.metric("lag_seconds") == 3
    log.down = False
    await rounds(a)
    assert a.metric("lag_seconds") == 0


async def test_bootstrap_applies_the_logs_tail_before_ready() -> None:
    log = MemoryLog([Delivery("old", {"notes": [1]}), Delivery("older", {"notes": [2]})])
    b = Replica(log, "b")
    assert not b.sync.ready()
    await rounds(b)
    assert b.sync.ready() and b.sync.bootstrapped
    assert b.notes.applied == [([1], "old"), ([2], "older")]
    assert b.metric("batches_total", direction="replayed") == 2


async def test_ready_after_the_bootstrap_timeout_when_the_log_is_down_then_catches_up() -> None:
    log = MemoryLog([Delivery("old", {"notes": [1]})], down=True)
    b = Replica(log, "b", bootstrap_timeout=2.0)
    assert not await b.sync.round()
    assert not b.sync.ready()
    b.clock.now += 2.0
    assert b.sync.ready()
    assert not b.sync.bootstrapped
    assert b.metric("bootstrapped") == 0
    assert b.metric("errors_total", operation="replay") == 1
    log.down = False
    await rounds(b)
    assert b.sync.bootstrapped
    assert b.notes.facts_from("old") == [1]


def test_not_ready_before_the_loop_starts() -> None:
    sync = StateSync(
        MemorySyncer(MemoryLog(), "a", bootstrap_timeout=0.0),
        [Notes()],
        interval=0.2,
        metrics=SyncMetrics(CollectorRegistry()),
    )
    assert not sync.ready()
    sync.begin()
    assert sync.ready()  # a zero bootstrap wait: ready at once


async def test_plugin_errors_are_counted_and_the_others_still_sync() -> None:
    log = MemoryLog()
    a = Replica(log, "a", Notes("broken", fail_export=True), Notes("fine"))
    b = Replica(log, "b", Notes("broken"), Notes("fine"))
    await rounds(a, b)
    a.plugins[1].learn(1)
    a.plugins[0].fail_export = False
    a.plugins[0].learn(2)
    b.plugins[0].fail_apply = True
    await rounds(a, b)
    assert b.plugins[1].facts_from("a") == [1]
    assert b.metric("errors_total", operation="apply") == 1
    assert a.metric("errors_total", operation="export") == 1


async def test_a_long_catch_up_yields_to_other_tasks_between_batches() -> None:
    log = MemoryLog([Delivery(f"r{i}", {"notes": [i]}) for i in range(50)])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    seen: list[int] = []
    b = Replica(log, "b")
    b.notes.apply_facts = lambda facts, origin: seen.append(ticks)  # type: ignore[method-assign]
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await rounds(b)
    task.cancel()
    assert len(seen) == 50 and seen[-1] - seen[0] >= 40


async def test_run_rounds_until_cancelled() -> None:
    log = MemoryLog()
    a, b = Replica(log, "a"), Replica(log, "b")
    tasks = [asyncio.create_task(r.sync.run()) for r in (a, b)]
    a.notes.learn("hello")
    async with asyncio.timeout(5):
        while not b.notes.facts_from("a"):
            await asyncio.sleep(0.01)
    for t in tasks:
        t.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)


def test_create_binds_the_pool_and_needs_a_syncer_and_something_to_share() -> None:
    registry = CollectorRegistry()
    syncer = MemorySyncer(MemoryLog(), "a")
    assert StateSync.create(None, [Notes()], interval=0.2, registry=registry) is None
    assert StateSync.create(syncer, [], interval=0.2, registry=registry) is None
    sync = StateSync.create(
        syncer, [Notes()], interval=0.05, registry=registry, namespace="prod", pool_name="llama"
    )
    assert sync is not None and sync.interval == 0.05
    assert syncer.pool == "prod/llama"
    assert registry.get_sample_value("llm_d_epp_state_sync_bootstrapped") == 0
    assert pool_scope("", "") == "default/default"


def test_create_asks_every_plugin_once_so_that_they_queue_facts_from_then_on() -> None:
    """Plugins queue facts for export only once asked (a lone replica keeps none): the engine
    asks when it is created, before any traffic."""
    asked: list[str] = []

    class Lazy(Notes):
        def export_facts(self) -> list[Any]:
            asked.append(self.typed_name.name)
            return super().export_facts()

    sync = StateSync.create(
        MemorySyncer(MemoryLog(), "a"), [Lazy("x"), Lazy("y")], interval=0.2,
        registry=CollectorRegistry(),
    )  # fmt: skip
    assert sync is not None and asked == ["x", "y"]


def runner(log: MemoryLog, rid: str, *, interval: float, gap: float) -> Replica:
    return Replica(log, rid, interval=interval, soon_gap=gap)


async def test_share_soon_publishes_at_once_not_at_the_next_interval() -> None:
    a = runner(MemoryLog(), "a", interval=30.0, gap=0.005)
    task = asyncio.create_task(a.sync.run())
    async with asyncio.timeout(5):
        while not a.sync.bootstrapped:  # the receive side replayed; the first publish round ran
            await asyncio.sleep(0.005)
    a.notes.learn("binding")
    a.sync.share_soon()
    async with asyncio.timeout(2):  # the interval is 30 s: only share_soon can publish it
        while not a.syncer.published:
            a.syncer.on_publish.clear()
            await a.syncer.on_publish.wait()
    task.cancel()
    assert a.syncer.published == [{"notes": ["binding"]}]


async def test_a_burst_of_share_soon_publishes_at_most_once_per_gap() -> None:
    gap = 0.04
    a = runner(MemoryLog(), "a", interval=30.0, gap=gap)
    task = asyncio.create_task(a.sync.run())
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(100):
        a.notes.learn(i)
        a.sync.share_soon()
        await asyncio.sleep(0.002)
    async with asyncio.timeout(2):
        while len([f for b in a.syncer.published for f in b["notes"]]) < 100:
            a.syncer.on_publish.clear()
            await a.syncer.on_publish.wait()
    elapsed = loop.time() - started
    task.cancel()
    times = a.syncer.published_at
    assert [f for b in a.syncer.published for f in b["notes"]] == list(range(100))
    # + 0.001: on uvloop, whose clock counts whole milliseconds, six gaps can span exactly
    # 240 ms, which the float division puts a hair below 6
    assert 2 <= len(times) <= elapsed / gap + 1.001
    assert min(t1 - t0 for t0, t1 in itertools.pairwise(times)) >= gap * 0.9


async def test_a_receive_that_returns_at_once_is_repeated_once_per_interval_not_in_a_spin() -> None:
    a = runner(MemoryLog(), "a", interval=0.05, gap=0.005)
    calls = 0
    receive = a.syncer.receive

    async def counted(wait: float = 0.0) -> list[Delivery]:
        nonlocal calls
        calls += 1
        assert wait == 0.05  # the engine asks the transport to wait one interval
        return await receive(wait)

    a.syncer.receive = counted  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(a.sync.run())
    started = loop.time()
    async with asyncio.timeout(5):
        while calls < 5:
            await asyncio.sleep(0.005)
    task.cancel()
    assert loop.time() - started >= 4 * 0.05 * 0.9


async def test_the_publish_side_retries_after_an_outage_and_publishes_what_waited() -> None:
    log = MemoryLog()
    a = runner(log, "a", interval=0.02, gap=0.005)
    task = asyncio.create_task(a.sync.run())
    async with asyncio.timeout(5):
        while not a.sync.bootstrapped:
            await asyncio.sleep(0.005)
    log.down = True
    a.notes.learn(1)
    a.sync.share_soon()
    async with asyncio.timeout(5):
        while a.metric("errors_total", operation="publish") < 1:
            await asyncio.sleep(0.005)
    log.down = False
    a.sync.share_soon()
    async with asyncio.timeout(5):
        while not a.syncer.published:
            await asyncio.sleep(0.005)
    task.cancel()
    assert a.syncer.published == [{"notes": [1]}]
    assert a.metric("errors_total", operation="publish") >= 1


async def test_a_slow_publish_round_stretches_the_gap_before_the_next() -> None:
    a = runner(MemoryLog(), "a", interval=30.0, gap=0.005)
    publish = a.syncer.publish  # a 20 ms round: a 200 ms gap, capped at 4 x 5 ms

    async def slow(batch: Any) -> None:
        await asyncio.sleep(0.02)  # a transport (or an event loop) that takes 20 ms a round
        await publish(batch)

    a.syncer.publish = slow  # type: ignore[method-assign]
    task = asyncio.create_task(a.sync.run())
    for i in range(2):
        a.notes.learn(i)
        a.sync.share_soon()
        async with asyncio.timeout(2):
            while len(a.syncer.published) <= i:
                a.syncer.on_publish.clear()
                await a.syncer.on_publish.wait()
    task.cancel()
    (t0, t1) = a.syncer.published_at
    assert t1 - t0 >= 0.02 + 4 * 0.005 * 0.9  # the round, then ten times its length: capped
