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

import argparse
import os
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from epp.plugins.sources.file_discovery import dump_endpoints
from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.replicas import EppSet

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
    sims_share: float = 0.0
    """CPU of the simulator processes together, as a share of one core."""
    switches_per_s: float = 0.0
    """Context switches of the EPP process's threads per second (each one a wake-up)."""
    kernel: float = 0.0
    """The part of the EPP's CPU spent in the kernel (``stime`` of ``/proc/<pid>/stat``)."""
    label: str = ""

    @property
    def expected_per_s(self) -> float:
        return self.pods * SCRAPES_PER_POD_S

    @property
    def us_per_scrape(self) -> float:
        return self.share / self.scrapes_per_s * 1e6 if self.scrapes_per_s else 0.0


def _task_files(pid: int, name: str) -> list[str]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out.append((task / name).read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that just ended
    return out


def run_seconds(pid: int) -> float:
    """Scheduler run time of every thread of ``pid`` so far (exact, unlike tick-based stat)."""
    return sum(int(text.split()[0]) for text in _task_files(pid, "schedstat")) / 1e9


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of ``pid`` so far."""
    total = 0
    for text in _task_files(pid, "status"):
        for line in text.splitlines():
            if "ctxt_switches:" in line:
                total += int(line.split()[-1])
    return total


def _user_system(pid: int) -> tuple[int, int]:
    """``utime`` and ``stime`` of ``pid`` in clock ticks (fields 14 and 15 of its stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]), int(fields[12])


def scrapes_answered(fleets: list[SimProcess]) -> int:
    return sum(int(s.get("metrics_scrapes", 0)) for f in fleets for s in f.stats().values())


def start_fleets(pods: int, work: Path, stack: ExitStack) -> list[SimProcess]:
    fleets: list[SimProcess] = []
    for i, first in enumerate(range(0, pods, PODS_PER_SIM)):
        spec = FleetSpec(pods=min(PODS_PER_SIM, pods - first))
        fleet = SimProcess(spec, work / f"sim{i}").start(timeout=120)
        stack.callback(fleet.stop)
        fleets.append(fleet)
    return fleets


def _endpoints(fleets: list[SimProcess], work: Path) -> Path:
    entries = [
        (f"pod-{n}", host, port)
        for n, (host, port) in enumerate(hp for f in fleets for hp in f.hostports)
    ]
    eps = work / "endpoints.yaml"
    eps.write_text(dump_endpoints(entries))
    return eps


def _measure(
    fleets: list[SimProcess], eps: Path, work: Path, variant: Variant, seconds: float, warmup: float
) -> IdleCost:
    label, pythonpath = variant
    # PYTHONSAFEPATH: ``python -m`` must not find this checkout's package in the working directory
    env = {"PYTHONPATH": str(pythonpath), "PYTHONSAFEPATH": "1"} if pythonpath is not None else {}
    group = EppSet(work, epp_config_text(eps, ()), env=env).start()
    try:
        pid = group.pids()["epp"]
        sims = [f.proc.pid for f in fleets if f.proc is not None]
        time.sleep(warmup)
        s0, t0 = scrapes_answered(fleets), time.monotonic()
        c0, x0, k0 = run_seconds(pid), context_switches(pid), sum(map(run_seconds, sims))
        u0, y0 = _user_system(pid)
        time.sleep(seconds)
        c1, x1, k1 = run_seconds(pid), context_switches(pid), sum(map(run_seconds, sims))
        u1, y1 = _user_system(pid)
        elapsed = time.monotonic() - t0
        rate = (scrapes_answered(fleets) - s0) / (time.monotonic() - t0)
    finally:
        group.stop()
    pods = sum(f.spec.pods for f in fleets)
    kernel = (y1 - y0) / max(1, (u1 - u0) + (y1 - y0))
    return IdleCost(
        pods, (c1 - c0) / elapsed, rate, (k1 - k0) / elapsed, (x1 - x0) / elapsed, kernel, label
    )


Variant = tuple[str, Path | None]
"""(label, the directory holding the ``epp`` package the EPP runs; None: this checkout)."""


def idle_costs(
    pods: int,
    variants: Sequence[Variant] = (("", None),),
    *,
    rounds: int = 1,
    seconds: float = 10.0,
    warmup: float = 3.0,
) -> list[IdleCost]:
    """The EPP's CPU and scrape rate over ``seconds`` of no traffic with ``pods`` pods, for each
    variant in turn, ``rounds`` times, against the same simulators (side by side)."""
    out = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        fleets = start_fleets(pods, work, stack)
        eps = _endpoints(fleets, work)
        for r in range(rounds):
            for i, variant in enumerate(variants):
                out.append(_measure(fleets, eps, work / f"epp{r}-{i}", variant, seconds, warmup))
    return out


def idle_cost(pods: int, *, seconds: float = 10.0, warmup: float = 3.0) -> IdleCost:
    """The EPP's CPU and scrape rate over ``seconds`` of no traffic with ``pods`` pods."""
    return idle_costs(pods, seconds=seconds, warmup=warmup)[0]


def idle_share(pods: int, *, seconds: float = 10.0, warmup: float = 3.0) -> float:
    """The EPP's CPU over ``seconds`` of no traffic, as a share of one core."""
    return idle_cost(pods, seconds=seconds, warmup=warmup).share


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp_tools.bench.micro.idle",
        description="Idle scraping cost of this checkout, and of others side by side.",
    )
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--other",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="another checkout's directory holding its epp package, measured in turn",
    )
    args = p.parse_args(argv)
    variants: list[Variant] = [("this", None)]
    for item in args.other:
        label, _, path = item.partition("=")
        variants.append((label, Path(path)))
    print(f"load average at start: {os.getloadavg()}")
    costs = idle_costs(args.pods, variants, rounds=args.rounds, seconds=args.seconds)
    for c in costs:
        print(
            f"{c.label:>8} {c.pods} pods: EPP {c.share * 100:6.2f}% of a core, "
            f"{c.scrapes_per_s:6.0f} of {c.expected_per_s:.0f} scrapes/s, "
            f"{c.us_per_scrape:5.0f} µs/scrape, {c.switches_per_s / max(c.scrapes_per_s, 1):.2f} "
            f"switches/scrape, {c.kernel * 100:.0f}% in the kernel; "
            f"simulators {c.sims_share * 100:.1f}% of a core"
        )
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
