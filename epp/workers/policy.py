"""The supervisor's decisions, as pure state machines: when to restart a worker, when to give up,
and when the group of workers is ready. No I/O and no clock of their own (the caller passes
``now``), so each rule is unit-tested on its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

MAX_CRASHES: Final = 5
"""A worker that exits this many times within ``CRASH_WINDOW`` is not restarted again."""
CRASH_WINDOW: Final = 60.0
"""Seconds over which exits count toward ``MAX_CRASHES``; older exits are forgotten."""
FIRST_DELAY: Final = 0.5
"""Seconds before the first restart; each further exit within the window doubles it."""
MAX_DELAY: Final = 10.0
"""The longest wait before a restart."""


@dataclass
class RestartPolicy:
    """Restart with exponential backoff; give up on a crash loop.

    Every exit of a worker the supervisor did not ask to stop is a crash. :meth:`on_crash`
    answers how long to wait before starting it again (``first_delay`` doubled for each crash
    still inside ``window``, at most ``max_delay``), or ``None`` once ``max_crashes`` crashes
    fall within ``window``: the worker cannot stay up and restarting it again would only hide
    that. A worker that stays up longer than ``window`` starts again from ``first_delay``.
    """

    max_crashes: int = MAX_CRASHES
    window: float = CRASH_WINDOW
    first_delay: float = FIRST_DELAY
    max_delay: float = MAX_DELAY
    _crashes: deque[float] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        if self.max_crashes < 1 or self.window <= 0:
            raise ValueError("RestartPolicy: max_crashes >= 1 and window > 0")
        self._crashes = deque(maxlen=self.max_crashes)

    def on_crash(self, now: float) -> float | None:
        """Record a crash at ``now``: seconds to wait before the restart, or ``None`` (give up)."""
        while self._crashes and now - self._crashes[0] > self.window:
            self._crashes.popleft()
        self._crashes.append(now)
        if len(self._crashes) >= self.max_crashes:
            return None
        return min(self.max_delay, self.first_delay * (1 << (len(self._crashes) - 1)))

    def recent_crashes(self) -> int:
        """Crashes recorded in the current window (as of the last :meth:`on_crash`)."""
        return len(self._crashes)


class GroupHealth:
    """Readiness of the group, as the supervisor's health port reports it.

    - Until every worker has been ready at the same time once ("warm"), the group is ready only
      when all are: traffic arrives only after each worker has discovered its endpoints and
      scraped them once, as a single process's readiness promises.
    - Once warm, the group is ready while at least one worker is ready. A worker that crashed
      and is restarting no longer listens on the shared port, so the kernel hands new
      connections to the others; taking the whole replica out of service for one worker's
      restart would turn a partial failure into an outage.
    - Draining: never ready (the supervisor keeps liveness SERVING).
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("GroupHealth: size >= 1")
        self._ready = [False] * size
        self._warm = False
        self._draining = False

    def set(self, index: int, ready: bool) -> None:
        self._ready[index] = ready
        if all(self._ready):
            self._warm = True

    def drain(self) -> None:
        self._draining = True

    @property
    def warm(self) -> bool:
        return self._warm

    @property
    def ready_flags(self) -> Sequence[bool]:
        return tuple(self._ready)

    def ready(self) -> bool:
        if self._draining:
            return False
        return any(self._ready) if self._warm else all(self._ready)
