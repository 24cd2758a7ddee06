"""``epp.datalayer.timers``: sleepers of one time and polls timing out together share a timer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from epp.datalayer.timers import Deadlines, WakeGroups
from tests.conftest import CLOCK_STEP

pytestmark = pytest.mark.both_loops  # timer semantics differ between uvloop and asyncio


def _count_timers(monkeypatch: pytest.MonkeyPatch, loop: asyncio.AbstractEventLoop) -> list[Any]:
    handles: list[Any] = []
    call_at = loop.call_at

    def counting(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        handle = call_at(when, *args, **kwargs)
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", counting)
    return handles


async def test_sleepers_of_one_time_share_one_timer_and_wake_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    handles = _count_timers(monkeypatch, loop)
    wakeups = WakeGroups(loop)
    when = loop.time() + 0.05
    woke: list[float] = []

    async def sleeper() -> None:
        await wakeups.sleep_until(when)
        woke.append(loop.time())

    await asyncio.gather(*(sleeper() for _ in range(5)))
    assert len(handles) == 1
    assert len(woke) == 5 and min(woke) >= when - CLOCK_STEP


async def test_a_cancelled_sleeper_leaves_the_others_asleep() -> None:
    loop = asyncio.get_running_loop()
    wakeups = WakeGroups(loop)
    when = loop.time() + 0.05
    first = asyncio.ensure_future(wakeups.sleep_until(when))
    second = asyncio.ensure_future(wakeups.sleep_until(when))
    await asyncio.sleep(0)  # both are asleep
    first.cancel()
    await second
    assert first.cancelled() and second.done() and not second.cancelled()


async def test_a_poll_past_its_deadline_is_cancelled_and_reported_expired() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop, timeout=0.05, quantum=0.005)
    started = loop.time()
    outcome: list[object] = []

    async def poll() -> None:
        task: Any = asyncio.current_task()
        when = deadlines.enter(task)
        try:
            try:
                await asyncio.Event().wait()  # never answers
            finally:
                outcome.append(deadlines.leave(when, task))
        except asyncio.CancelledError:
            outcome.append(task.cancelling())
            outcome.append(loop.time() - started)

    await poll()
    expired, cancelling, elapsed = outcome
    assert expired is True and cancelling == 0
    assert isinstance(elapsed, float) and elapsed >= 0.05 - CLOCK_STEP


async def test_polls_ending_in_time_cancel_their_shared_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    handles = _count_timers(monkeypatch, loop)
    deadlines = Deadlines(loop, timeout=10.0, quantum=1.0)
    results = []

    async def poll() -> None:
        task: Any = asyncio.current_task()
        when = deadlines.enter(task)
        await asyncio.sleep(0)
        results.append(deadlines.leave(when, task))

    await asyncio.gather(poll(), poll())
    assert results == [False, False]
    assert len(handles) == 1 and handles[0].cancelled()  # no wake-up left for it


async def test_a_callers_cancellation_is_not_taken_for_a_timeout() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop, timeout=0.01, quantum=0.005)
    seen: list[int] = []
    entered = asyncio.Event()

    async def poll() -> None:
        task: Any = asyncio.current_task()
        when = deadlines.enter(task)
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            seen.append(deadlines.leave(when, task))
            seen.append(task.cancelling())

    task = asyncio.ensure_future(poll())
    await entered.wait()
    task.cancel()  # the caller's own cancellation
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [False, 1]
