"""``epp bench together``: two or more targets driven at the same time, each on its own fleet,
optionally beside CPU burners, so that they see the same machine load.

``epp bench`` runs its targets one after another; on a shared machine whose load comes and goes
the later target meets another load than the earlier one, and under heavy load that difference
is larger than the one being measured. Here every target is started first (its own simulated
fleet, Envoy and EPP, as ``epp bench`` starts them), warmed up, then the workload's requests are
sent to all of them at once, and after that each one's probe (sequential small requests on
fresh connections, then on one reused connection, ``epp_tools.bench.runner.driver.probe``) runs, the
targets taking turns request by request. ``--burners N`` starts N busy-looping processes at normal
priority for the measured phase and the probes (stopped afterwards, and at the latest when the
run ends)::

    epp bench together --workload a --targets epp,sglang --burners 6

It prints one line per target: requests answered, TTFT p50/p90 (ms), the probe's fresh and
reused TTFT p50 (ms), and the EPP's and Envoy's CPU per request (ms) during the measured phase,
with the machine's load average at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.runner import driver, targets
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.runner.run import warm_pods
from epp_tools.bench.workloads.catalog import build, resolve
from epp_tools.bench.workloads.spec import Workload
from epp_tools.stack.procs import tree_cpu_seconds as cpu_seconds

BURN = "while True: pass"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank below) of the finite values, in ms; NaN when none."""
    finite = sorted(v for v in values if v == v)
    if not finite:
        return float("nan")
    return finite[min(len(finite) - 1, int(len(finite) * q))] * 1000


def line(key: str, outcomes: Sequence[driver.Outcome], probe: dict[str, list[float]],
         cpu: dict[str, float]) -> str:  # fmt: skip
    ttft = [o.ttft for o in outcomes if o.ok]
    per_req = {n: s * 1000 / max(1, len(ttft)) for n, s in cpu.items()}
    cpu_text = " · ".join(f"{n} {v:.2f}" for n, v in sorted(per_req.items()))
    return (
        f"{key}: {len(ttft)}/{len(outcomes)} ok, TTFT p50 {percentile(ttft, 0.5):.1f} "
        f"p90 {percentile(ttft, 0.9):.1f}, probe fresh {percentile(probe['fresh'], 0.5):.1f} "
        f"reused {percentile(probe['reused'], 0.5):.1f}, CPU ms/req {cpu_text}"
    )


async def _probes(runs: dict[str, targets.Running], n: int) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {k: {"fresh": [], "reused": []} for k in runs}
    for _ in range(n):  # one probe request per target in turn, so they meet the same load
        for key, run in runs.items():
            one = await driver.probe(run.url, 1)
            for kind in ("fresh", "reused"):
                out[key][kind] += one[kind]
    return out


async def _measure(
    workload: Workload, sims: dict[str, SimProcess], runs: dict[str, targets.Running],
    burners: int, probes: int,
) -> list[str]:  # fmt: skip
    for key, run in runs.items():
        await warm_up(run.url)
        await warm_pods(sims[key], workload)
    burn = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(burners)]
    try:
        cpu0 = {k: {n: cpu_seconds(p) for n, p in r.processes.items()} for k, r in runs.items()}
        results = await asyncio.gather(
            *(
                driver.run(
                    run.url,
                    workload.requests,
                    concurrency=workload.concurrency,
                    time_scale=workload.fleet.time_scale,
                )
                for run in runs.values()
            )
        )
        cpu = {
            k: {n: cpu_seconds(p) - cpu0[k][n] for n, p in r.processes.items()}
            for k, r in runs.items()
        }
        probed = await _probes(runs, probes)
    finally:
        for p in burn:
            p.kill()
            p.wait()
    return [
        line(key, outcomes, probed[key], cpu[key])
        for key, outcomes in zip(runs, results, strict=True)
    ]


def run(workload_name: str, keys: Sequence[str], burners: int, probes: int) -> list[str]:
    workload = build(resolve(workload_name), scale="default", seed=1, time_scale=0.0)
    sims: dict[str, SimProcess] = {}
    runs: dict[str, targets.Running] = {}
    with tempfile.TemporaryDirectory(prefix="epp-together-") as tmp:
        try:
            for key in keys:
                workdir = Path(tmp) / key.replace(":", "-").replace("/", "_")
                workdir.mkdir(parents=True)
                sims[key] = SimProcess(targets.fleet_spec(key, workload), workdir).start()
                runs[key] = targets.start(key, sims[key], workload, workdir)
            return asyncio.run(_measure(workload, sims, runs, burners, probes))
        finally:
            for r in runs.values():
                r.stop()
            for s in sims.values():
                s.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="epp bench together", description=__doc__)
    p.add_argument("--workload", default="a", help="one workload (default a)")
    p.add_argument("--targets", default="epp,rr", help="comma-separated targets")
    p.add_argument("--burners", type=int, default=0, help="busy-looping processes beside them")
    p.add_argument("--probe", type=int, default=10, help="probe requests per target")
    args = p.parse_args(argv)
    keys = [k.strip() for k in args.targets.split(",") if k.strip()]
    unknown = [k for k in keys if not targets.is_known(k)]
    if len(keys) < 2 or unknown or len(set(keys)) != len(keys):
        p.error(f"--targets needs two or more distinct known targets (unknown: {unknown})")
    if args.burners < 0 or args.probe < 1:
        p.error("--burners must be >= 0 and --probe >= 1")
    t0 = time.monotonic()
    for text in run(args.workload, keys, args.burners, args.probe):
        print(text, flush=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at the end {load}; {time.monotonic() - t0:.0f} s", flush=True)
    return 0
