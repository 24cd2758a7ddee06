"""Child processes of a benchmark run: start, wait until ready, measure from /proc, stop.

Each process is started with its output in a log file of the run's work directory and stopped
by its own PID (SIGTERM, then SIGKILL after a grace period). CPU time and peak memory come from
the kernel's accounting of that PID:

* CPU seconds: ``utime + stime`` of ``/proc/<pid>/stat`` (fields 14 and 15, in clock ticks),
  i.e. all threads of the process;
* the same summed over a process and its descendants (``tree_cpu_seconds``: a supervisor and its
  workers);
* peak RSS: ``VmHWM`` of ``/proc/<pid>/status`` (the high-water mark since the process started);
  current RSS: ``VmRSS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
T = TypeVar("T")


class Terminated(Exception):
    """The command got SIGTERM; what it started has been stopped."""


async def until_terminated(main: Coroutine[object, object, T]) -> T:
    """Await ``main`` in this task, SIGTERM cancelling it as Ctrl-C would, so that its
    ``finally`` blocks stop the processes it started instead of leaving them orphaned; raises
    ``Terminated`` then."""
    task = asyncio.current_task()
    assert task is not None
    terminated: list[bool] = []

    def on_sigterm() -> None:
        terminated.append(True)
        task.cancel()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await main
    except asyncio.CancelledError:
        if not terminated:
            raise
        raise Terminated from None
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def direct_opener() -> urllib.request.OpenerDirector:
    """An opener that ignores proxy settings of the environment (loopback targets only)."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0.0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = text[text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/*/children``, recursively): the
    workers of an ``epp --workers`` supervisor count as the EPP's CPU."""
    out: list[int] = []
    todo = [pid]
    while todo and len(out) < 1024:
        current = todo.pop()
        out.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants so far."""
    return sum(cpu_seconds(p) for p in descendants(pid))


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_rss_bytes(pid: int) -> int:
    """``VmHWM`` of ``pid`` in bytes (0 if it is gone)."""
    return _status_kb(pid, "VmHWM:")


def rss_bytes(pid: int) -> int:
    """``VmRSS`` of ``pid`` in bytes (0 if it is gone)."""
    return _status_kb(pid, "VmRSS:")


@dataclass
class Proc:
    """A started child process and its log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else 0

    def start(self) -> Proc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - closed by stop()
        try:
            self.popen = subprocess.Popen(
                list(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )
        finally:
            log.close()  # the child holds its own descriptor
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=5)


START_TIMEOUT = 180.0
"""Seconds a benchmark waits for a process it started to serve (a simulator, an EPP, its
endpoints, a replica back in Envoy's rotation). It bounds a hang only: a process that exits
fails the wait at once, and on a 2-core machine at load average 17 importing the EPP alone
took 46 s."""


def wait_http(url: str, proc: Proc, timeout: float = START_TIMEOUT) -> None:
    """Poll ``url`` until it answers 200; raise with the log tail if the process dies first."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.log_tail()}")
        try:
            with direct_opener().open(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError) as exc:
            last = str(exc)
        time.sleep(0.1)
    raise TimeoutError(f"{proc.name} not ready at {url} after {timeout:g}s ({last})")
