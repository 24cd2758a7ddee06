"""The event loop an EPP process runs on: uvloop by default, the standard library's on request.

Every message Envoy sends the EPP wakes its event loop for one read and one write. The standard
library's loop spends that turn in Python (``_run_once``, the selector, a handle per callback);
uvloop spends it in libuv, in C. Behind Envoy, on a machine whose cores go cold between messages,
the loop's own share of each wake-up is part of what a message costs: side by side (``epp bench
--targets epp,epp-asyncio``), uvloop took about 7% less CPU per request over twelve pairs on the
workloads a, b and b-pressure, nine of them in its favour (docs/benchmarks.md, "uvloop as the
default"). The EPP's code is the same on both; ``--event-loop asyncio`` selects the standard
library's loop, as does a machine where uvloop cannot be imported (with a warning).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

EVENT_LOOPS: Final = ("uvloop", "asyncio")


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of ``name``'s loop; None for the standard library's."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as exc:  # uvloop has no Windows build; the EPP still runs there
        log.warning("uvloop is not available (%s): running on the standard asyncio loop", exc)
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], name: str) -> T:
    """``asyncio.run(main)`` on the loop ``name`` (one of :data:`EVENT_LOOPS`)."""
    with asyncio.Runner(loop_factory=loop_factory(name)) as runner:
        return runner.run(main)
