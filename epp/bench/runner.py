"""Runs every selected workload against every selected target, one at a time, and reports.

For each (workload, target): start a cold simulated fleet (its own ``epp sim`` process), start
the target in front of it, send one warm-up request (until it answers 200, bounded), snapshot the
pods' counters and the target's CPU time, run the workload, snapshot again, read peak RSS, run
the fresh-connection probe, stop the target and the fleet. A target that cannot be installed or
started is reported with the reason and the run goes on.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from epp.bench import driver, targets
from epp.bench.fleet import SimProcess, stats_delta
from epp.bench.oracle import compute_oracle
from epp.bench.peers import PeerUnavailable
from epp.bench.procs import cpu_seconds, peak_rss_bytes
from epp.bench.results import TargetResult, add_peer_ratios, summarize
from epp.bench.spec import Workload, limit_requests
from epp.bench.workloads import build

_WARMUP_TIMEOUT = 30.0


@dataclass(frozen=True)
class Options:
    workloads: Sequence[str]
    targets: Sequence[str]
    out: Path
    scale: str = "default"
    seed: int = 1
    time_scale: float = 0.0
    requests: int = 0
    probe: int = 10
    deadline: float = 600.0


def log(message: str) -> None:
    print(f"bench: {message}", flush=True)


async def warm_up(url: str) -> None:
    """One small request until it is answered 200 (the target may still be connecting)."""
    deadline = time.monotonic() + _WARMUP_TIMEOUT
    last = ""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while time.monotonic() < deadline:
            out = await driver.send(http, url, 0, driver.probe_request(9999), time.perf_counter())
            if out.ok:
                return
            last = out.error or f"HTTP {out.status}"
            await asyncio.sleep(0.2)
    raise RuntimeError(f"warm-up request never succeeded: {last}")


async def run_target(
    key: str, workload: Workload, oracle_ratio: float, opts: Options, workdir: Path
) -> TargetResult:
    result = TargetResult(key, targets.label(key))
    sim = SimProcess(workload.fleet, workdir)
    running: targets.Running | None = None
    try:
        sim.start()
        running = targets.start(key, sim, workload, workdir)
        await warm_up(running.url)
        before = sim.stats()
        cpu0 = {name: cpu_seconds(pid) for name, pid in running.processes.items()}
        outcomes = await driver.run(
            running.url,
            workload.requests,
            concurrency=workload.concurrency,
            time_scale=workload.fleet.time_scale,
            deadline=opts.deadline,
        )
        cpu = {n: cpu_seconds(pid) - cpu0[n] for n, pid in running.processes.items()}
        delta = stats_delta(before, sim.stats())
        result.peak_rss_mb = {
            n: round(peak_rss_bytes(pid) / 2**20, 1) for n, pid in running.processes.items()
        }
        probe = await driver.probe(running.url, opts.probe)
        summarize(result, outcomes, delta, oracle_ratio, cpu, probe)
    except Exception as exc:
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if running is not None:
            running.stop()
        sim.stop()
    return result


def _prepare_targets(keys: Sequence[str]) -> dict[str, str]:
    """Install what each target needs; target -> reason it is unavailable."""
    unavailable: dict[str, str] = {}
    for key in keys:
        try:
            targets.prepare(key)
        except PeerUnavailable as exc:
            unavailable[key] = str(exc)
            log(f"{key}: not available: {exc}")
    return unavailable


def _describe(r: TargetResult, seconds: float) -> str:
    if r.status != "ok":
        return f"{r.target}: {r.status}: {r.reason}"
    return (
        f"{r.target}: {r.ok}/{r.requests} ok, hit {r.hit_ratio:.1%} ({r.oracle_share:.0%} of "
        f"oracle), TTFT p50 {r.ttft_p50_ms:.1f} ms p90 {r.ttft_p90_ms:.1f} ms, "
        f"{r.out_tok_per_s:.0f} tok/s, imbalance {r.imbalance:.2f} [{seconds:.1f}s]"
    )


async def run_workload(name: str, opts: Options, unavailable: dict[str, str]) -> dict[str, Any]:
    workload = build(name, scale=opts.scale, seed=opts.seed, time_scale=opts.time_scale)
    workload.requests = limit_requests(workload.requests, opts.requests)
    t0 = time.monotonic()
    oracle = compute_oracle(workload.requests, workload.fleet.block_size)
    log(
        f"({workload.name}) {workload.title}: {len(workload.requests)} requests, achievable "
        f"reuse {oracle.ratio:.1%} (oracle {time.monotonic() - t0:.1f}s)"
    )
    results: list[TargetResult] = []
    for key in opts.targets:
        if key in unavailable:
            results.append(TargetResult(key, targets.label(key), "skipped", unavailable[key]))
            continue
        t1 = time.monotonic()
        workdir = opts.out / "work" / workload.name / key
        result = await run_target(key, workload, oracle.ratio, opts, workdir)
        log(f"({workload.name}) {_describe(result, time.monotonic() - t1)}")
        results.append(result)
    add_peer_ratios(results, list(targets.PEERS))
    return {
        "name": workload.name,
        "title": workload.title,
        "description": workload.description,
        "requests": len(workload.requests),
        "concurrency": workload.concurrency,
        "fleet": workload.fleet.as_json(),
        "shape": workload.shape,
        "oracle": oracle.as_json(),
        "epp_extra_scorers": [list(s) for s in workload.epp_extra_scorers],
        "results": [r.as_json() for r in results],
    }


async def run(opts: Options) -> dict[str, Any]:
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    unavailable = _prepare_targets(opts.targets)
    workloads = [await run_workload(name, opts, unavailable) for name in opts.workloads]
    return {
        "run": {
            "started": started,
            "scale": opts.scale,
            "seed": opts.seed,
            "time_scale_override": opts.time_scale,
            "request_cap": opts.requests,
            "cpus": os.cpu_count() or 0,
            "targets": list(opts.targets),
        },
        "workloads": workloads,
    }
