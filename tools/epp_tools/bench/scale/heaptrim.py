"""What ``--memory-trim-interval`` gives back: the EPP's RSS after a burst of long prompts and a
quiet interval, with the heap trimmer off and on.

For each setting in turn (off first): a simulated fleet of ``pods`` pods and one EPP (the built-in
default config, file discovery, ``--memory-trim-interval`` 0 or ``interval``), then ``rounds``
bursts of ``requests`` chat requests of about ``tokens`` prompt tokens each (1 output token,
``epp_tools.bench.workloads.long.big_bodies``), sent open loop at ``rate`` a second; the EPP's RSS
and glibc heap (``/debug/runtime?heap=1``) right after the bursts, then again after ``quiet``
seconds without traffic, and the EPP process's CPU over the whole run::

    python -m epp_tools.bench.scale.heaptrim            # 3 x 40 prompts of 195,000 tokens
    python -m epp_tools.bench.scale.heaptrim --quick    # small prompts, a short quiet (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.rate.load import open_loop
from epp_tools.bench.rate.stats import arrivals
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.scale.probe import debug_runtime
from epp_tools.bench.workloads.long import big_bodies
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.procs import tree_cpu_seconds
from epp_tools.stack.replicas import EppSet


@dataclass(frozen=True)
class Options:
    rounds: int = 3
    requests: int = 40
    tokens: int = 195_000
    rate: float = 4.0
    quiet: float = 65.0
    interval: float = 60.0
    pods: int = 8


QUICK = Options(rounds=1, requests=8, tokens=20_000, rate=8.0, quiet=1.5, interval=0.5, pods=2)


@dataclass(frozen=True)
class Result:
    interval: float
    answered: int
    rss_after_mb: float
    rss_quiet_mb: float
    heap_in_use_mb: float
    heap_free_mb: float
    cpu_s: float


async def measure(interval: float, opts: Options, workdir: Path) -> Result:
    """One setting of ``--memory-trim-interval`` (0 = off) on a fleet of its own."""
    fleet = FleetSpec(pods=opts.pods, time_scale=4.0, num_gpu_blocks=100_000,
                      max_model_len=1 << 19)  # fmt: skip
    sim = SimProcess(fleet, workdir)
    eset: EppSet | None = None
    try:
        sim.start()
        eps = workdir / "endpoints.yaml"
        eps.write_text(endpoints_yaml(sim))
        args = ["--memory-trim-interval", f"{interval}s"]
        eset = EppSet(workdir, epp_config_text(eps, ()), extra_args=args)
        eset.start()
        await warm_up(eset.url)
        answered = 0
        for r in range(opts.rounds):
            bodies = big_bodies(opts.requests, opts.tokens, seed=10 + r)
            times = arrivals(opts.rate, opts.requests / opts.rate, "uniform")
            shots, _ = await open_loop(eset.url, bodies, times, timeout=60.0, stream=True)
            answered += sum(1 for s in shots if s.ok)
        after = await debug_runtime(eset.metrics_url(0), "heap=1")
        await asyncio.sleep(opts.quiet)
        quiet = await debug_runtime(eset.metrics_url(0), "heap=1")
        cpu = tree_cpu_seconds(eset.pids()["epp"])
        heap = quiet.get("heap") or {}
        return Result(
            interval=interval,
            answered=answered,
            rss_after_mb=round(after["rssBytes"] / 2**20, 1),
            rss_quiet_mb=round(quiet["rssBytes"] / 2**20, 1),
            heap_in_use_mb=round(heap.get("inUseBytes", 0) / 2**20, 1),
            heap_free_mb=round(heap.get("freeBytes", 0) / 2**20, 1),
            cpu_s=round(cpu, 2),
        )
    finally:
        if eset is not None:
            eset.stop()
        sim.stop()


async def run(opts: Options) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="epp-heaptrim-") as tmp:
        out = []
        for interval in (0.0, opts.interval):
            workdir = Path(tmp) / f"trim-{interval:g}"
            workdir.mkdir()
            out.append(await measure(interval, opts, workdir))
        return out


def table(results: list[Result], opts: Options) -> str:
    lines = [
        f"{opts.rounds} x {opts.requests} requests of ~{opts.tokens:,} prompt tokens at "
        f"{opts.rate:g}/s, then {opts.quiet:g} s without traffic:",
        "",
        "| --memory-trim-interval | answered | RSS after the bursts (MB) | RSS after the quiet "
        "(MB) | C heap in use / free (MB) | EPP CPU (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        label = "0 (off)" if r.interval == 0 else f"{r.interval:g}s"
        lines.append(
            f"| {label} | {r.answered} | {r.rss_after_mb:.0f} | {r.rss_quiet_mb:.0f} | "
            f"{r.heap_in_use_mb:.0f} / {r.heap_free_mb:.0f} | {r.cpu_s:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp_tools.bench.scale.heaptrim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small prompts, a short quiet (tests)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    opts = QUICK if args.quick else Options()
    results = asyncio.run(run(opts))
    print(table(results, opts))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    return 0 if all(r.answered == opts.rounds * opts.requests for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
