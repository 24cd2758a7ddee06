"""Runs every selected workload against every selected target, one at a time, and reports.

For each (workload, target): start a cold simulated fleet (its own ``epp sim`` process), start
the target in front of it, send one warm-up request (until it answers 200, bounded), send the
workload's ``warm_prefixes`` to every pod directly (so shared prompts start cached everywhere),
start the workload's foreign load if it has one (traffic sent straight to one pod, bypassing
the target, see ``epp_tools.bench.runner.foreign``; it runs until the workload is done), snapshot
the pods' counters and the target's CPU time, run the workload (an EPP target's flow-control queue
gauges are polled meanwhile), snapshot again, stop the foreign load, read peak RSS, run the
fresh-connection probe, stop the target and the fleet. The session statistics (colocation,
Responses follow-ups, foreign-load avoidance) come from the outcomes
(``epp_tools.bench.runner.sessions``). A target that cannot be installed or started is reported with
the reason and the run goes on.

A workload with a ``reference_objective`` (the overload workload's latency-sensitive class) is
then run once more with only that class's requests, same arrival times, on a fresh idle fleet:
the idle-fleet reference its latency under load is compared with. It goes through the config
of the first EPP target that ran with flow control on (else the first EPP target that ran): the
config whose latency target it measures.

A P/D target (``epp-pd``) runs on the workload's P/D fleet (``Workload.pd_fleet``) instead; it is
skipped, with the reason, on a workload without one or when its config's plugins do not load. A
run without ``--targets`` (``Options.auto_targets``) adds each workload's ``extra_targets``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from epp_tools.bench.fleet import SimProcess, stats_delta
from epp_tools.bench.peers.routers import PeerUnavailable
from epp_tools.bench.runner import driver, targets
from epp_tools.bench.runner.eppmetrics import QueueSampler, byte_caps
from epp_tools.bench.runner.foreign import ForeignTraffic
from epp_tools.bench.runner.results import (
    TargetResult,
    add_peer_ratios,
    net_of_idle,
    summarize,
)
from epp_tools.bench.runner.sessions import add_foreign_stats, add_session_stats
from epp_tools.bench.workloads.catalog import build
from epp_tools.bench.workloads.oracle import compute_oracle
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, Workload, limit_requests
from epp_tools.stack.procs import peak_rss_bytes, rss_bytes
from epp_tools.stack.procs import tree_cpu_seconds as cpu_seconds


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
    auto_targets: bool = False
    """The targets are the default list: add each workload's ``extra_targets``."""


def log(message: str) -> None:
    print(f"bench: {message}", flush=True)


async def warm_pods(sim: SimProcess, workload: Workload) -> None:
    """Each of the workload's warm prompts once to every pod, bypassing the router."""
    if not workload.warm_prefixes:
        return
    timeout = aiohttp.ClientTimeout(total=driver.WARMUP_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one_pod(url: str) -> None:
            for i, messages in enumerate(workload.warm_prefixes):
                req = BenchRequest(f"warm-{i}", 0, MODEL, messages, 1)
                out = await driver.send(http, url, i, req, time.perf_counter())
                if not out.ok:
                    raise RuntimeError(f"warming {url} failed: {out.error or out.status}")

        await asyncio.gather(*(one_pod(url) for url in sim.urls))


async def _drive(
    running: targets.Running, workload: Workload, requests: list[BenchRequest], opts: Options
) -> tuple[list[driver.Outcome], dict[str, Any]]:
    """Run the requests; for an EPP target with objectives also sample its queues."""
    kwargs: dict[str, Any] = {
        "concurrency": workload.concurrency,
        "time_scale": workload.fleet.time_scale,
        "deadline": opts.deadline,
    }
    if not (running.metrics_url and workload.objectives):
        return await driver.run(running.url, requests, **kwargs), {}
    rss0 = rss_bytes(running.processes.get("epp") or running.processes.get("epp-0", 0))
    async with QueueSampler(running.metrics_url) as sampler:
        outcomes = await driver.run(running.url, requests, **kwargs)
    priorities = sorted({p for _, p in workload.objectives}, reverse=True)
    memory = {
        "rss_start_mb": round(rss0 / 2**20, 1),
        "queue": sampler.as_json(),
        "caps": byte_caps(running.config_text, priorities),
    }
    return outcomes, memory


IDLE_S = 4.0
"""Each target's processes are measured idle this long before the run: what they spend with no
request (the EPP's scraping of the pods every 50 ms, 1-6% of a core here) is a rate, not a cost
per request, and at the workloads' few seconds of traffic it is a large share of the EPP's CPU
per request; the report gives the CPU per request net of it beside the raw figure."""


@dataclass
class _Measured:
    outcomes: list[driver.Outcome]
    memory: dict[str, Any]
    delta: dict[str, dict[str, float]]
    cpu: dict[str, float]
    foreign: dict[str, Any]
    wall_s: float = 0.0


async def idle_cores(running: targets.Running, seconds: float = IDLE_S) -> dict[str, float]:
    """Each of the target's processes' CPU over ``seconds`` with no traffic, in cores."""
    cpu0 = {name: cpu_seconds(pid) for name, pid in running.processes.items()}
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - t0
    procs = running.processes
    return {name: round((cpu_seconds(pid) - cpu0[name]) / wall, 4) for name, pid in procs.items()}


async def _start_foreign(sim: SimProcess, workload: Workload, seed: int) -> ForeignTraffic | None:
    if workload.foreign is None:
        return None
    url = sim.urls[workload.foreign.pod]
    traffic = ForeignTraffic(workload.foreign, url, workload.fleet.max_num_seqs, seed)
    await traffic.start()
    return traffic


async def _measure(
    running: targets.Running,
    sim: SimProcess,
    workload: Workload,
    todo: list[BenchRequest],
    opts: Options,
) -> _Measured:
    """The measured phase: counters and CPU around the run, foreign load (if any) throughout."""
    foreign = await _start_foreign(sim, workload, opts.seed)
    foreign_stats: dict[str, Any] = {}
    try:
        before = sim.stats()
        cpu0 = {name: cpu_seconds(pid) for name, pid in running.processes.items()}
        t0 = time.perf_counter()
        if foreign is not None:
            foreign.begin()
        outcomes, memory = await _drive(running, workload, todo, opts)
        cpu = {n: cpu_seconds(pid) - cpu0[n] for n, pid in running.processes.items()}
        wall = time.perf_counter() - t0
        delta = stats_delta(before, sim.stats())
    finally:
        if foreign is not None:
            foreign_stats = await foreign.stop()
    return _Measured(outcomes, memory, delta, cpu, foreign_stats, wall)


def _add_session_stats(
    result: TargetResult, workload: Workload, sim: SimProcess, m: _Measured, oracle: float
) -> None:
    add_session_stats(result, m.outcomes)
    if workload.foreign is not None:
        pods = list(sim.pods)
        busy = pods[workload.foreign.pod]
        add_foreign_stats(result, m.outcomes, pods, busy, m.foreign, oracle)


async def run_target(
    key: str,
    workload: Workload,
    oracle_ratio: float,
    opts: Options,
    workdir: Path,
    requests: list[BenchRequest] | None = None,
    probe_n: int | None = None,
) -> TargetResult:
    """One measured run of ``requests`` (default: the workload's) against target ``key``."""
    result = TargetResult(key, targets.label(key))
    sim = SimProcess(targets.fleet_spec(key, workload), workdir)
    running: targets.Running | None = None
    try:
        sim.start()
        running = targets.start(key, sim, workload, workdir)
        await driver.warm_up(running.url)
        await warm_pods(sim, workload)
        idle = await idle_cores(running)
        todo = workload.requests if requests is None else requests
        m = await _measure(running, sim, workload, todo, opts)
        result.peak_rss_mb = {
            n: round(peak_rss_bytes(pid) / 2**20, 1) for n, pid in running.processes.items()
        }
        probe = await driver.probe(running.url, opts.probe if probe_n is None else probe_n)
        measured = [o for o in m.outcomes if todo[o.index].at >= workload.measure_from]
        summarize(result, m.outcomes, m.delta, oracle_ratio, m.cpu, probe, measured)
        net_of_idle(result, idle, m.wall_s)
        result.epp_memory = m.memory
        _add_session_stats(result, workload, sim, m, oracle_ratio)
    except Exception as exc:
        result.status, result.reason = "failed", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if running is not None:
            running.stop()
        sim.stop()
    return result


async def run_reference(
    key: str, workload: Workload, opts: Options, workdir: Path
) -> dict[str, Any]:
    """The reference class alone on an idle fleet through target ``key``: its class stats."""
    name = workload.reference_objective
    requests = [r for r in workload.requests if r.objective == name]
    result = await run_target(key, workload, 0.0, opts, workdir, requests, probe_n=0)
    if result.status != "ok":
        return {"objective": name, "status": result.status, "reason": result.reason}
    return {"objective": name, "status": "ok", **result.classes.get(name, {})}


def _prepare_targets(keys: Sequence[str], unavailable: dict[str, str]) -> dict[str, str]:
    """Install what each target not yet prepared needs; ``unavailable`` (target -> reason it is
    unavailable) holds every prepared target, ``""`` for those that are available."""
    for key in keys:
        if key in unavailable:
            continue
        try:
            targets.prepare(key)
            unavailable[key] = ""
        except (PeerUnavailable, targets.TargetUnavailable) as exc:
            unavailable[key] = str(exc)
            log(f"{key}: not available: {exc}")
    return unavailable


def _workload_targets(workload: Workload, opts: Options) -> list[str]:
    keys = list(opts.targets)
    if opts.auto_targets:
        keys += [k for k in workload.extra_targets if k not in keys]
    return keys


def _skip_reason(key: str, workload: Workload, unavailable: dict[str, str]) -> str:
    if unavailable.get(key):
        return unavailable[key]
    if targets.is_pd(key) and workload.pd_fleet is None:
        return f"workload ({workload.name}) has no P/D fleet"
    return ""


def _session_words(r: TargetResult) -> str:
    parts = []
    if r.colocation is not None:
        parts.append(f"colocation {r.colocation:.0%}")
    if r.followup_success is not None:
        parts.append(f"follow-ups {r.followup_success:.0%} ok ({r.followups_404} x 404)")
    if r.busy_pod_share is not None:
        parts.append(
            f"{r.busy_pod_share:.0%} to busy {r.busy_pod} "
            f"(others imbalance {r.others_imbalance or 0:.2f})"
        )
    return "".join(", " + p for p in parts)


def _describe(r: TargetResult, seconds: float) -> str:
    if r.status != "ok":
        return f"{r.target}: {r.status}: {r.reason}"
    return (
        f"{r.target}: {r.ok}/{r.requests} ok, hit {r.hit_ratio:.1%} ({r.oracle_share:.0%} of "
        f"oracle){_session_words(r)}, TTFT p50 {r.ttft_p50_ms:.1f} ms p90 "
        f"{r.ttft_p90_ms:.1f} ms, {r.out_tok_per_s:.0f} tok/s, imbalance {r.imbalance:.2f} "
        f"[{seconds:.1f}s]"
    )


def _dirname(key: str) -> str:
    return key.replace(":", "-").replace("/", "_")


async def _reference(
    workload: Workload, results: list[TargetResult], opts: Options
) -> dict[str, Any]:
    """The idle-fleet reference run (see the module doc); ``{}`` when there is none."""
    ran = [r for r in results if r.status == "ok" and r.target.startswith("epp")]
    if not workload.reference_objective or not ran:
        return {}
    key = next((r.target for r in ran if r.epp_memory.get("caps")), ran[0].target)
    t1 = time.monotonic()
    workdir = opts.out / "work" / workload.name / (_dirname(key) + "-idle")
    ref = await run_reference(key, workload, opts, workdir)
    log(
        f"({workload.name}) idle {ref['objective']} through {key}: "
        f"{ref.get('served', 0)}/{ref.get('sent', 0)} served, TTFT p50 "
        f"{ref.get('ttft_p50_ms', 0):.1f} ms p99 {ref.get('ttft_p99_ms', 0):.1f} ms "
        f"[{time.monotonic() - t1:.1f}s]"
    )
    return {"target": key, "label": targets.label(key), **ref}


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
    keys = _workload_targets(workload, opts)
    _prepare_targets(keys, unavailable)
    for key in keys:
        reason = _skip_reason(key, workload, unavailable)
        if reason:
            results.append(TargetResult(key, targets.label(key), "skipped", reason))
            continue
        t1 = time.monotonic()
        workdir = opts.out / "work" / workload.name / _dirname(key)
        result = await run_target(key, workload, oracle.ratio, opts, workdir)
        log(f"({workload.name}) {_describe(result, time.monotonic() - t1)}")
        results.append(result)
    reference = await _reference(workload, results, opts)
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
        "objectives": [list(o) for o in workload.objectives],
        "reference_objective": workload.reference_objective,
        "measure_from_s": workload.measure_from,
        "foreign_load": workload.foreign.as_json() if workload.foreign else {},
        "pd_fleet": workload.pd_fleet.as_json() if workload.pd_fleet else {},
        "reference": reference,
        "results": [r.as_json() for r in results],
    }


def machine() -> str:
    """The CPU model and count, memory and kernel of this machine, for a report's header."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} x {model}, {mem_gb:.0f} GiB, {platform.system()} {platform.release()}"


async def run(opts: Options) -> dict[str, Any]:
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_before = os.getloadavg()
    unavailable = _prepare_targets(opts.targets, {})
    workloads = [await run_workload(name, opts, unavailable) for name in opts.workloads]
    return {
        "run": {
            "started": started,
            "command": "epp bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else []),
            "machine": machine(),
            "load_average": [round(x, 1) for x in (*load_before, *os.getloadavg())],
            "scale": opts.scale,
            "seed": opts.seed,
            "time_scale_override": opts.time_scale,
            "request_cap": opts.requests,
            "cpus": os.cpu_count() or 0,
            "targets": list(opts.targets),
        },
        "workloads": workloads,
    }
