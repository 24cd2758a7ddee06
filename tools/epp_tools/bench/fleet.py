"""Simulated pods as processes, as the benchmarks start them.

``SimProcess``: the simulated fleet of one run, an ``epp sim`` process of its own, started cold
per target. Every target gets a freshly started fleet (empty KV caches, zeroed counters), so
targets are compared from the same cold state. ``endpoints_yaml`` is its endpoints file (with
the ``llm-d.ai/role`` labels of a P/D fleet).

``PodSet``: one ``epp sim --pods 1`` process per pod (so that one can be killed), named
``pod-<i>`` in the ``x-sim-pod`` header (``sim_pod`` maps the simulator's name back), listening
on ``hosts[i]`` (127.0.0.1 unless told: the Kubernetes scenarios give each pod its own loopback
address and one shared port, as pods of an InferencePool have). Faults are set with the
simulator's ``POST /sim/faults`` (``epp_tools.sim.control``); ``afault`` runs the call in a
thread so that the load keeps its pace.

Either way the pods' ports are picked by the OS and read from the ``sim pod <name> listening on
<url>`` lines the simulator prints (``parse_ready``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp.plugins.sources.file_discovery import dump_endpoints
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
            self.pods = parse_ready(self.proc.log_tail(1_000_000))
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


def parse_ready(log: str) -> dict[str, str]:
    """Pod name → base URL, from the simulator's ``sim pod <name> listening on <url>`` lines."""
    pods: dict[str, str] = {}
    for line in log.splitlines():
        if line.startswith(_READY_PREFIX) and " listening on " in line:
            name, _, url = line[len(_READY_PREFIX) :].partition(" listening on ")
            pods[name.strip()] = url.strip()
    return pods


def endpoints_yaml(fleet: SimProcess) -> str:
    """The endpoints file of ``fleet`` (file discovery), with its P/D role labels."""
    return dump_endpoints(
        (
            (name, host, port)
            for name, (host, port) in zip(fleet.pods, fleet.hostports, strict=True)
        ),
        labels=fleet.spec.role_labels(),
    )


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
                ready = parse_ready(proc.log_tail(100_000))
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
