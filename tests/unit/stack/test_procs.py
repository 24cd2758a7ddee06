"""``until_terminated``: SIGTERM stops what a benchmark command started instead of orphaning it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import asyncio, sys
from pathlib import Path
from epp_tools.stack.procs import Proc, Terminated, until_terminated

async def run() -> None:
    child = Proc("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"],
                 Path(sys.argv[1]) / "sleeper.log").start()
    try:
        print(child.pid, flush=True)
        await asyncio.sleep(120)
    finally:
        await asyncio.to_thread(child.stop)

try:
    asyncio.run(until_terminated(run()))
except Terminated:
    sys.exit(143)
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] == "Z"  # a zombie has exited


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see the child process")
def test_sigterm_stops_the_children_of_the_command(tmp_path: Path) -> None:
    cmd = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert cmd.stdout is not None
    child = int(cmd.stdout.readline())  # the child runs and the handler is installed
    cmd.send_signal(signal.SIGTERM)
    try:
        assert cmd.wait(timeout=30) == 143
        assert _gone(child), "the child was left running"  # stopped and reaped before the exit
    finally:
        for pid in (cmd.pid, child):
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
