"""What a process that does not stop is waiting for.

A stop is bounded: the drain window, then a second or so for the servers, the plugins and the
background tasks. An App still stopping ``STUCK_AFTER`` seconds past its drain window logs, once,
every asyncio task still pending and every other thread, each with where it stands, so the log
says what held it up before a supervisor or the kubelet kills it (``epp --workers`` kills a
worker ``STOP_GRACE`` = 10 s after its drain window; ``STUCK_AFTER`` is below that).
A worker also dumps its threads' Python stacks on SIGUSR1 (``faulthandler``), which the
supervisor sends just before it kills one: that dump is written even when the event loop itself
is blocked.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import traceback
from typing import Final

STUCK_AFTER: Final = 5.0

log = logging.getLogger(__name__)

_FRAMES = 6  # innermost frames shown per task or thread: enough to see the await, not the loop


def _where(frames: list[traceback.FrameSummary]) -> str:
    return " <- ".join(f"{f.name} ({f.filename}:{f.lineno})" for f in reversed(frames))


def _awaiting(coro: object) -> list[traceback.FrameSummary]:
    """The chain of coroutines ``coro`` awaits, outermost first (where a suspended task stands:
    ``Task.get_stack`` gives only its outermost frame)."""
    frames = []
    for _ in range(64):  # bounded: an await chain is short
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        frames.append(traceback.FrameSummary(code.co_filename, frame.f_lineno, code.co_name))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


def pending_tasks() -> list[str]:
    """One line per pending task but the caller's: its name and innermost awaits."""
    me = asyncio.current_task()
    lines = []
    for task in asyncio.all_tasks():
        if task is not me and not task.done():
            stack = _awaiting(task.get_coro())[-_FRAMES:]
            lines.append(f"task {task.get_name()}: {_where(stack) or repr(task.get_coro())}")
    return sorted(lines)


def other_threads() -> list[str]:
    """One line per thread but this one: its name and innermost frames."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    lines = []
    for ident, frame in sys._current_frames().items():
        if ident != me:
            stack = traceback.extract_stack(frame)[-_FRAMES:]
            lines.append(f"thread {names.get(ident, ident)}: {_where(stack)}")
    return sorted(lines)


def report(seconds: float) -> None:
    """Log what this process still waits for, ``seconds`` into its stop."""
    lines = pending_tasks() + other_threads()
    log.warning(
        "still stopping %.1fs after the stop began; waiting on:\n  %s",
        seconds,
        "\n  ".join(lines) or "nothing pending (the event loop's own shutdown)",
    )
