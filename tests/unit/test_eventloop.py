"""``--event-loop``: uvloop by default, the standard library's on request or where uvloop is
missing (with a warning), and the same coroutine result on either."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from epp.eventloop import run


async def loop_module() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_run_gives_the_coroutine_result_on_the_loop_asked_for(name: str) -> None:
    assert run(loop_module(), name) == name


def test_without_uvloop_the_standard_loop_runs_and_a_warning_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop -> ImportError
    with caplog.at_level(logging.WARNING, logger="epp.eventloop"):
        assert run(loop_module(), "uvloop") == "asyncio"
    assert "uvloop is not available" in caplog.text
