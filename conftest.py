"""Suite-wide hooks.

* Order: the suite runs in random order (pytest-randomly); the seed is printed at the start and in
  the summary, also under ``-q``, so a failing order can be repeated with ``--randomly-seed=N``.
* Event loop: every asyncio test runs on the loop ``epp`` runs on by default
  (``epp.eventloop.EVENT_LOOPS[0]``, uvloop), so the tests see what production runs; a test
  marked ``both_loops`` runs on each loop of ``EVENT_LOOPS``, its id ending in the loop's name,
  since ``--event-loop asyncio`` selects the standard library's: the tests of the servers that
  drive their transports themselves (the ext_proc server's, the simulator's gRPC server) and of
  what differs by loop (the profile endpoint's clocks).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

from epp.eventloop import EVENT_LOOPS, loop_factory


def _seed_line(config: pytest.Config) -> str | None:
    if not config.pluginmanager.hasplugin("randomly"):
        return None
    return f"random order: repeat with --randomly-seed={config.getoption('randomly_seed')}"


def pytest_sessionstart(session: pytest.Session) -> None:
    line = _seed_line(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    line = _seed_line(config)
    if line:
        terminalreporter.write_line(line)


def _new_loop(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    return loop_factory(name) or asyncio.new_event_loop


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    names = EVENT_LOOPS if item.get_closest_marker("both_loops") else EVENT_LOOPS[:1]
    return {name: _new_loop(name) for name in names}
