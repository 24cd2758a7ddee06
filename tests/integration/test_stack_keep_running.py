"""``epp stack --keep-running`` prints the ``epp explain``/``endpoints``/``state`` commands for the
EPP it keeps up, with its random port and TLS flag: pasted as printed, each one answers."""

from __future__ import annotations

import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(900)]

EPP = str(Path(sys.executable).parent / "epp")


def _lines_until_up(proc: subprocess.Popen[str], timeout: float) -> list[str]:
    """stdout up to the indented commands after "stack is up" (read in a thread: bounded)."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1.0).rstrip("\n")
        except queue.Empty:
            assert proc.poll() is None, "\n".join(seen)
            continue
        seen.append(line)
        commands = [x for x in seen if x.startswith("  ")]
        if any(x.startswith("stack is up") for x in seen) and len(commands) == 3:
            return seen
    raise AssertionError("no commands printed in time:\n" + "\n".join(seen))


def test_keep_running_prints_admin_commands_that_work_as_pasted() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EPP_METRICS_TOKEN"}
    argv = [EPP, "stack", "--keep-running", "--skip-baseline", "--pods", "2", "--time-scale", "20"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        seen = _lines_until_up(proc, timeout=600)
        commands = [x.strip() for x in seen if x.startswith("  ")]
        assert [shlex.split(c)[1] for c in commands] == ["explain", "endpoints", "state"]
        for command in commands:
            argv = shlex.split(command)
            assert "--insecure" in argv and "--address" in argv  # the stack's EPP serves TLS
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            assert done.stdout.strip(), command
        explain = subprocess.run(shlex.split(commands[0]), capture_output=True, text=True)
        assert "destination 127.0.0.1:" in explain.stdout
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
