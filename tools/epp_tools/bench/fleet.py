"""The simulated fleet of one run: an ``epp sim`` process of its own, started cold per target.

Every target gets a freshly started fleet (empty KV caches, zeroed counters), so targets are
compared from the same cold state. The pods' ports are picked by the OS and read from the
``sim pod <name> listening on <url>`` lines the simulator prints.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.procs import START_TIMEOUT, Proc, direct_opener

_READY_PREFIX = "sim pod "


@dataclass
class SimProcess:
    spec: FleetSpec
    workdir: Path
    proc: Proc | None = None
    pods: dict[str, str] = field(default_factory=dict)
    """pod name -> base URL, in pod order."""

    @property
    def urls(self) -> list[str]:
        return list(self.pods.values())

    @property
    def hostports(self) -> list[tuple[str, int]]:
        out = []
        for url in self.urls:
            host, _, port = url.removeprefix("http://").rpartition(":")
            out.append((host, int(port)))
        return out

    def start(self, timeout: float = START_TIMEOUT) -> SimProcess:
        argv = [sys.executable, "-m", "epp", "sim", *self.spec.sim_args()]
        self.proc = Proc("simulator", argv, self.workdir / "sim.log").start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.proc.alive():
                raise RuntimeError(f"epp sim exited:\n{self.proc.log_tail()}")
            self.pods = _parse_ready(self.proc.log_tail(1_000_000))
            if len(self.pods) == self.spec.pods:
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"epp sim: {len(self.pods)} of {self.spec.pods} pods ready")

    def stats(self) -> dict[str, dict[str, Any]]:
        """``GET /sim/stats`` of every pod (pod name -> counters)."""
        out: dict[str, dict[str, Any]] = {}
        opener = direct_opener()
        for name, url in self.pods.items():
            with opener.open(f"{url}/sim/stats", timeout=10) as r:
                out[name] = json.loads(r.read())
        return out

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


def _parse_ready(log: str) -> dict[str, str]:
    pods: dict[str, str] = {}
    for line in log.splitlines():
        if line.startswith(_READY_PREFIX) and " listening on " in line:
            name, _, url = line[len(_READY_PREFIX) :].partition(" listening on ")
            pods[name.strip()] = url.strip()
    return pods


def stats_delta(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, dict[str, float]]:
    """Per-pod difference of the numeric counters (what one phase of the run did)."""
    out: dict[str, dict[str, float]] = {}
    for pod, counters in after.items():
        base = before.get(pod, {})
        out[pod] = {
            key: value - base.get(key, 0)
            for key, value in counters.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }
    return out
