"""Timers the collector's endpoint tasks share: one timer handle per wake-up time, not per task.

Endpoints of one tick phase sleep until the same loop time and start their polls in the same
event-loop iteration; a timer handle each (``loop.call_at``, a heap entry, a cancel) would be
most of the bookkeeping of an idle scrape. Here the sleepers of one time share one handle
(``WakeGroups``), and so do the polls whose timeouts end in the same ``quantum`` (``Deadlines``):
a poll times out ``timeout`` after it started, rounded up to the next multiple of ``quantum``
of the loop clock; the shared timer is cancelled when its last poll ends in time.
"""

from __future__ import annotations

import asyncio
import math


class WakeGroups:
    """``sleep_until(when)``: the sleepers of one loop time share one timer handle."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._groups: dict[float, list[asyncio.Future[None]]] = {}

    async def sleep_until(self, when: float) -> None:
        """Sleep until loop time ``when`` exactly (the sleepers of one ``when`` wake in the same
        iteration; a cancelled sleeper leaves the others asleep)."""
        waiter = self._loop.create_future()
        group = self._groups.get(when)
        if group is None:
            group = self._groups[when] = []
            self._loop.call_at(when, self._wake, when)
        group.append(waiter)
        await waiter

    def _wake(self, when: float) -> None:
        for waiter in self._groups.pop(when, ()):
            if not waiter.done():
                waiter.set_result(None)


class Deadlines:
    """Poll timeouts: the tasks whose deadline falls in the same ``quantum`` share one timer,
    which cancels those still inside (as ``asyncio.timeout`` does)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float, quantum: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._quantum = quantum
        self._groups: dict[float, tuple[set[asyncio.Task[object]], asyncio.TimerHandle]] = {}
        self._expired: set[asyncio.Task[object]] = set()

    def enter(self, task: asyncio.Task[object]) -> float:
        """Start ``task``'s timeout now; returns its deadline (for ``leave``)."""
        q = self._quantum
        when = math.ceil((self._loop.time() + self._timeout) / q) * q
        group = self._groups.get(when)
        if group is None:
            group = self._groups[when] = (set(), self._loop.call_at(when, self._expire, when))
        group[0].add(task)
        return when

    def leave(self, when: float, task: asyncio.Task[object]) -> bool:
        """End ``task``'s timeout; True if it expired (its cancellation is then withdrawn: a
        ``CancelledError`` it raised is the timeout, unless ``task.cancelling()`` says someone
        else cancelled it too)."""
        group = self._groups.get(when)
        if group is not None:
            group[0].discard(task)
            if not group[0]:  # nothing left to time out: no wake-up for it
                group[1].cancel()
                del self._groups[when]
        if task in self._expired:
            self._expired.discard(task)
            task.uncancel()
            return True
        return False

    def _expire(self, when: float) -> None:
        tasks, _ = self._groups.pop(when, (set(), None))
        for task in tasks:
            self._expired.add(task)
            task.cancel()
