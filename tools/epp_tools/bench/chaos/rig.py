"""The rig of ``epp bench chaos``: simulated pods as separate processes (so one can be killed),
the EPP behind Envoy (``epp_tools.stack.replicaset.EppSet``), the endpoints file, and fault
controls.

Each pod is its own ``epp sim --pods 1`` process, named ``pod-<i>`` in the ``x-sim-pod`` header,
listening on ``hosts[i]`` (127.0.0.1 unless told: the Kubernetes scenario gives each pod its own
loopback address and one shared port, as pods of an InferencePool have). Faults are set with the
simulator's ``POST /sim/faults`` (``epp_tools.sim.control``). Blocking work (process start, HTTP
control calls) runs in a thread so the load keeps its pace.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp.plugins.sources.file_discovery import dump_endpoints
from epp_tools.bench.fleet import _parse_ready
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.procs import START_TIMEOUT, Proc, direct_opener


@dataclass
class ChaosOptions:
    out: Path = Path("out/chaos")
    scenarios: list[str] = field(default_factory=list)
    clients: int = 6
    before: float = 4.0
    fault: float = 4.0
    after: float = 4.0
    time_scale: float = 1.0
    seed: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="epp-chaos-")))


def log(message: str) -> None:
    print(f"bench chaos: {message}", flush=True)


@dataclass
class PodSet:
    workdir: Path
    spec: FleetSpec
    count: int
    hosts: Sequence[str] = ()
    port: int = 0
    first: int = 0
    """Number of the first pod (``pod-<first>``): a replacement pod gets a name of its own."""
    procs: dict[str, Proc] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [f"pod-{self.first + i}" for i in range(self.count)]

    def _argv(self, i: int) -> list[str]:
        host = self.hosts[i] if self.hosts else "127.0.0.1"
        return [
            sys.executable, "-m", "epp", "sim", *self.spec.sim_args(),
            "--pods", "1", "--port", str(self.port), "--pod-name-prefix", f"{self.names[i]}.",
            "--host", host,
        ]  # fmt: skip

    def start(self, timeout: float = START_TIMEOUT) -> PodSet:
        for i, name in enumerate(self.names):
            self.procs[name] = Proc(name, self._argv(i), self.workdir / f"{name}.log").start()
        deadline = time.monotonic() + timeout
        for name in self.names:
            proc = self.procs[name]
            while name not in self.urls:
                if not proc.alive():
                    raise RuntimeError(f"{name} exited:\n{proc.log_tail()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} not ready after {timeout:g}s")
                ready = _parse_ready(proc.log_tail(100_000))
                if f"{name}.0" in ready:
                    self.urls[name] = ready[f"{name}.0"]
                else:
                    time.sleep(0.05)
        return self

    def hostport(self, name: str) -> tuple[str, int]:
        host, _, port = self.urls[name].removeprefix("http://").rpartition(":")
        return host, int(port)

    def endpoints_yaml(self, names: Sequence[str] | None = None) -> str:
        chosen = self.names if names is None else names
        return dump_endpoints((n, *self.hostport(n)) for n in chosen)

    def terminate(self, name: str, grace: float = 10.0) -> None:
        """SIGTERM: the pod stops accepting connections, finishes what it serves, exits."""
        self.procs[name].stop(grace=grace)

    def kill(self, name: str) -> None:
        """SIGKILL: the pod dies at once, its connections reset, nothing is drained."""
        proc = self.procs[name]
        if proc.popen is not None and proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout=10)

    def fault(self, name: str, faults: dict[str, Any]) -> None:
        data = json.dumps(faults).encode()
        req = urllib.request.Request(
            f"{self.urls[name]}/sim/faults",
            data=data,
            headers={"Content-Type": "application/json"},
        )
        with direct_opener().open(req, timeout=5) as r:
            r.read()

    async def afault(self, name: str, faults: dict[str, Any]) -> None:
        await asyncio.to_thread(self.fault, name, faults)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop(grace=5)


def sim_pod(shot_pod: str) -> str:
    """``pod-3.0`` (the simulator's name of the only pod of process ``pod-3``) → ``pod-3``."""
    return shot_pod.rsplit(".", 1)[0] if shot_pod else ""


def wait_endpoints(metrics_port: int, n: int, timeout: float = START_TIMEOUT) -> None:
    """Wait until the EPP on ``metrics_port`` lists ``n`` endpoints (discovery has synced)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{metrics_port}/debug/endpoints"
            with direct_opener().open(url, timeout=2) as r:
                seen = len(json.loads(r.read())["endpoints"])
        except OSError:
            seen = -1
        if seen == n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the EPP lists {seen} endpoints, not {n}, after {timeout:g}s")
