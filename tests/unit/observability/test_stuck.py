"""``epp.observability.stuck``: a stop that overruns its bound says what it waits on."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from epp.observability import stuck
from tests.conftest import dead_ports


async def _inner(gate: asyncio.Event) -> None:
    await gate.wait()


async def _outer(gate: asyncio.Event) -> None:
    await _inner(gate)


async def test_the_report_names_each_pending_task_where_it_waits_and_each_other_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, release = asyncio.Event(), threading.Event()
    task = asyncio.create_task(_outer(gate), name="held-up")
    thread = threading.Thread(target=release.wait, name="blocked-call", daemon=True)
    thread.start()
    await asyncio.sleep(0)  # the task reaches its await
    try:
        with caplog.at_level(logging.WARNING, "epp.observability.stuck"):
            stuck.report(12.5)
    finally:
        gate.set()
        release.set()
        await task
        thread.join(5)
    (record,) = caplog.records
    text = record.getMessage()
    assert text.startswith("still stopping 12.5s after the stop began; waiting on:")
    (line,) = [line for line in text.splitlines() if "task held-up" in line]
    assert line.index("wait (") < line.index("_inner (") < line.index("_outer (")  # innermost first
    assert any("thread blocked-call: wait (" in line for line in text.splitlines())
    assert "test_the_report_names" not in text  # the reporting task itself is left out


async def test_an_app_whose_stop_overruns_reports_once(
    start_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[float] = []
    fired = asyncio.Event()

    def report(seconds: float) -> None:
        reported.append(seconds)
        fired.set()

    monkeypatch.setattr(stuck, "report", report)
    # a 30 s drain stands in for a stop that hangs; the report is due 0.2 s into it
    monkeypatch.setattr(stuck, "STUCK_AFTER", -29.8)
    app = await start_app(dead_ports(2), ready=False, drain_timeout=30.0)
    app.stop()
    async with asyncio.timeout(10):
        await fired.wait()
    app.stop()  # a second stop cuts the drain short
    assert reported == [pytest.approx(0.2)]


async def test_a_stop_within_its_bound_reports_nothing(
    start_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    reported: list[float] = []
    monkeypatch.setattr(stuck, "report", reported.append)
    monkeypatch.setattr(stuck, "STUCK_AFTER", 0.3)
    app = await start_app(dead_ports(2), ready=False, drain_timeout=0.0)
    await app.__aexit__(None, None, None)
    await asyncio.sleep(0.5)  # past the report's time: nothing may fire once the App stopped
    assert reported == []
