"""``epp bench micro`` rows for idle CPU: the EPP process with no traffic, scraping its pods.

A simulated fleet of ``pods`` pods (``epp sim``, at most ``PODS_PER_SIM`` pods per simulator
process, so serving ``/metrics`` 20 times a second per pod is spread over several processes) and
the EPP (``epp`` with the built-in default config, file discovery of the pods,
``--refresh-metrics-interval`` 50 ms, behind its Envoy as in ``epp bench``) start; after a
warm-up of ``warmup`` seconds the EPP process's CPU time (every thread's scheduler run time,
``/proc/<pid>/task/*/schedstat``, in nanoseconds) is read over ``seconds`` seconds of no
traffic: the share of one core that scraping, the pool gauges and the other background work
take. The simulators' own ``/metrics`` counters give the scrape rate actually reached over the
same window, to compare with the 20 x pods a second asked for: below it, the machine (the
simulators, or the EPP itself) did not keep up, and the CPU share is that of fewer scrapes.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from epp.bench.fleet import SimProcess
from epp.bench.replicaset import EppSet
from epp.bench.spec import FleetSpec
from epp.localstack.eppconfig import epp_config_text
from epp.plugins.sources.file_discovery import dump_endpoints

POD_COUNTS = (4, 100)
PODS_PER_SIM = 25
SCRAPES_PER_POD_S = 20.0  # one scrape per pod every 50 ms


@dataclass(frozen=True)
class IdleCost:
    pods: int
    share: float
    """CPU of the EPP process as a share of one core."""
    scrapes_per_s: float
    """``/metrics`` requests the simulators answered per second over the same window."""

    @property
    def expected_per_s(self) -> float:
        return self.pods * SCRAPES_PER_POD_S


def run_seconds(pid: int) -> float:
    """Scheduler run time of every thread of ``pid`` so far (exact, unlike tick-based stat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
    return total / 1e9


def _scrapes(fleets: list[SimProcess]) -> int:
    return sum(int(s.get("metrics_scrapes", 0)) for f in fleets for s in f.stats().values())


def idle_cost(pods: int, *, seconds: float = 10.0, warmup: float = 3.0) -> IdleCost:
    """The EPP's CPU and scrape rate over ``seconds`` of no traffic with ``pods`` pods."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        fleets: list[SimProcess] = []
        for i, first in enumerate(range(0, pods, PODS_PER_SIM)):
            spec = FleetSpec(pods=min(PODS_PER_SIM, pods - first))
            fleet = SimProcess(spec, work / f"sim{i}").start(timeout=120)
            stack.callback(fleet.stop)
            fleets.append(fleet)
        entries = [
            (f"pod-{n}", host, port)
            for n, (host, port) in enumerate(hp for f in fleets for hp in f.hostports)
        ]
        eps = work / "endpoints.yaml"
        eps.write_text(dump_endpoints(entries))
        group = EppSet(work / "epp", epp_config_text(eps, ())).start()
        stack.callback(group.stop)
        pid = group.pids()["epp"]
        time.sleep(warmup)
        s0, w0 = _scrapes(fleets), time.monotonic()
        t0, c0 = time.monotonic(), run_seconds(pid)
        time.sleep(seconds)
        share = (run_seconds(pid) - c0) / (time.monotonic() - t0)
        rate = (_scrapes(fleets) - s0) / (time.monotonic() - w0)
        return IdleCost(pods, share, rate)


def idle_share(pods: int, *, seconds: float = 10.0, warmup: float = 3.0) -> float:
    """The EPP's CPU over ``seconds`` of no traffic, as a share of one core."""
    return idle_cost(pods, seconds=seconds, warmup=warmup).share
