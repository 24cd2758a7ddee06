"""How the Director runs a producer under its timeout: a producer that never waits is run to the
end inline, with no timer; one that waits gets the timer, with its deadline counted from the
start, and cancellations reach it as they would under a task."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from epp.plugin import Endpoint, InferenceRequest
from epp.requestcontrol.director import _bounded
from tests.unit.requestcontrol.test_director import BODY, HEADERS, director, hint, pipeline


class Producer:
    """Sets ``produced``; ``waits`` awaits that many loop turns first."""

    def __init__(self, waits: int = 0) -> None:
        self.waits = waits
        self.typed_name = "producer/p"

    async def produce(self, request: InferenceRequest, pool: Sequence[Endpoint]) -> None:
        for _ in range(self.waits):
            await asyncio.sleep(0)
        request.attributes["produced"] = len(pool)


def _no_timers(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> Any:
        raise AssertionError("a timer was armed")

    monkeypatch.setattr(asyncio, "timeout", refuse)
    monkeypatch.setattr(asyncio, "timeout_at", refuse)


async def test_a_producer_that_never_waits_runs_without_a_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = director(pipeline(producers=[Producer()], producer_timeouts=[5.0]))
    request = d.new_request(HEADERS)
    _no_timers(monkeypatch)
    await d.decide(request, BODY, hint("192.168.1.1", "192.168.1.2"))
    assert request.attributes["produced"] == 2


async def test_a_producer_that_waits_finishes_under_its_timer() -> None:
    d = director(pipeline(producers=[Producer(waits=3)], producer_timeouts=[5.0]))
    request = d.new_request(HEADERS)
    await d.decide(request, BODY, hint("192.168.1.1"))
    assert request.attributes["produced"] == 1


async def test_the_result_of_what_it_waits_on_reaches_it() -> None:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[int] = loop.create_future()
    got: list[int] = []

    async def produce() -> None:
        got.append(await future)
        got.append(await asyncio.sleep(0, 7))

    loop.call_soon(future.set_result, 42)
    await _bounded(produce(), 5.0)
    assert got == [42, 7]


async def test_the_deadline_counts_the_work_before_the_first_wait() -> None:
    async def produce() -> None:
        time.sleep(0.05)  # longer than the timeout, before any await
        await asyncio.sleep(0)

    with pytest.raises(TimeoutError):
        await _bounded(produce(), 0.02)


async def test_a_waiting_producer_past_its_timeout_is_cancelled_inside() -> None:
    seen: list[str] = []

    async def produce() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    with pytest.raises(TimeoutError):
        await _bounded(produce(), 0.01)
    assert seen == ["cancelled", "finally"]


async def test_cancelling_the_request_reaches_the_producer() -> None:
    started, seen = asyncio.Event(), []

    async def produce() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            seen.append("finally")

    task = asyncio.create_task(_bounded(produce(), 5.0))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["finally"]


async def test_a_producer_may_catch_a_cancellation_and_go_on_waiting() -> None:
    """What a task allows (a coroutine that handles a thrown exception and waits again) works
    here too: the timeout's cancellation is caught, the producer waits once more and returns."""
    steps: list[str] = []

    async def produce() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            steps.append("caught")
        await asyncio.sleep(0)
        steps.append("returned")

    await _bounded(produce(), 0.01)  # swallowed: the timeout does not turn it into an error
    assert steps == ["caught", "returned"]


async def test_a_failure_after_a_wait_is_the_producers_error() -> None:
    async def produce() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad fact")

    with pytest.raises(ValueError, match="bad fact"):
        await _bounded(produce(), 5.0)


async def test_a_produce_that_returns_another_awaitable_is_awaited_under_its_timer() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_soon(done.set_result, None)
    await _bounded(done, 5.0)
    assert done.done()
    with pytest.raises(TimeoutError):
        await _bounded(loop.create_future(), 0.01)
