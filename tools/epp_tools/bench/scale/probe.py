"""What ``epp bench scale`` reads around a measured window, and the row it makes of two readings.

A ``Snapshot`` holds the wall clock, the CPU seconds of each process of the target (the EPP with
its ``--workers`` children, Envoy or the peer router), of the simulator and of this client, the
EPP's ``/metrics`` text (empty for other targets) and the pods' ``/sim/stats`` counters summed
over the fleet. ``step_row`` turns two snapshots and the records answered between them into the
numbers of one ramp step (see ``epp_tools.bench.scale`` for each column).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.rate.stats import format_ms, parse_histogram
from epp_tools.bench.rate.summary import PICK
from epp_tools.bench.scale.drive import Record
from epp_tools.bench.workloads.text import percentile
from epp_tools.stack.procs import rss_bytes, tree_cpu_seconds
from epp_tools.stack.replicas import metric_sums

SIM_COUNTERS = ("preemptions", "prompt_tokens", "prefix_hit_tokens", "generation_tokens")
STATE_GAUGES = {
    "prefix_entries": "llm_d_epp_prefix_indexer_size",
    "response_bindings": "llm_d_epp_response_affinity_bindings",
}
"""The EPP's bounded state, sampled over a hold: what its RSS growth is made of."""


@dataclass(frozen=True)
class Snapshot:
    at: float
    cpu: Mapping[str, float]
    metrics: str = ""
    sim: Mapping[str, float] = field(default_factory=dict)


async def _text(url: str, timeout: float = 10.0) -> str:
    if not url:
        return ""
    limit = aiohttp.ClientTimeout(total=timeout)
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with aiohttp.ClientSession(timeout=limit) as http, http.get(url) as r:
            return await r.text()
    return ""


async def state_gauges(metrics_url: str) -> dict[str, float]:
    """``STATE_GAUGES`` read from the EPP's ``/metrics`` (each summed over its label sets; absent
    when the EPP does not run that plugin or has no metrics URL)."""
    try:
        sums = metric_sums(await _text(metrics_url))
    except ValueError:  # a cut-off exposition: this sample goes without the gauges
        sums = {}
    out = {key: sums[family] for key, family in STATE_GAUGES.items() if family in sums}
    if metrics_url.endswith("/metrics"):
        out.update(await _allocators(metrics_url.removesuffix("/metrics")))
    return out


async def tracemalloc_command(metrics_url: str, action: str, top: int = 15) -> dict[str, Any]:
    """``baseline`` or ``diff`` of the EPP's traced allocations (``epp.observability.memory``;
    the EPP runs under ``PYTHONTRACEMALLOC``); the diff's ``top`` sites, or ``{}``."""
    base = metrics_url.removesuffix("/metrics")
    if not base or base == metrics_url:
        return {}
    text = await _text(f"{base}/debug/runtime?tracemalloc={action}&top={top}", timeout=120)
    try:
        found = json.loads(text).get("tracemalloc", {}) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


async def debug_runtime(metrics_url: str, query: str = "heap=1&pymalloc=1") -> dict[str, Any]:
    """The EPP's ``/debug/runtime?<query>`` (``epp.observability.memory``) as a dict; ``{}``
    where the debug views are off or the answer is not JSON."""
    base = metrics_url.removesuffix("/metrics")
    if not base or base == metrics_url:
        return {}
    text = await _text(f"{base}/debug/runtime?{query}")
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


async def _allocators(base: str) -> dict[str, float]:
    """The EPP's allocators from ``/debug/runtime`` (``epp.observability.memory``): bytes Python's
    small-object allocator has in use, and the C heap's bytes in use and free (held, not given
    back); empty where the debug views are off or the C library is not glibc."""
    runtime = await debug_runtime(f"{base}/metrics")
    heap, pymalloc = runtime.get("heap") or {}, runtime.get("pymalloc") or {}
    picked = {
        "pymalloc_bytes": pymalloc.get("allocatedBytes"),
        "heap_in_use_bytes": heap.get("inUseBytes"),
        "heap_free_bytes": heap.get("freeBytes"),
    }
    return {k: float(v) for k, v in picked.items() if isinstance(v, (int, float))}


def _sim_totals(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    out = {k: float(sum(s.get(k, 0) for s in stats.values())) for k in SIM_COUNTERS}
    out["preempting_pods"] = float(sum(1 for s in stats.values() if s.get("preemptions", 0)))
    return out


async def snapshot(pids: Mapping[str, int], metrics_url: str, sim: SimProcess) -> Snapshot:
    stats = await asyncio.to_thread(sim.stats)
    cpu = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    cpu["client"] = time.process_time()
    return Snapshot(time.perf_counter(), cpu, await _text(metrics_url), _sim_totals(stats))


@dataclass
class WindowSampler:
    """Once a second while a window runs: the live sessions, the working set and the RSS of each
    target process (their means and peaks go into the row)."""

    working_set: list[int] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)
    rss: dict[str, list[int]] = field(default_factory=dict)

    def sample(self, working_set: int, sessions: int, pids: Mapping[str, int]) -> None:
        self.working_set.append(working_set)
        self.sessions.append(sessions)
        for name, pid in pids.items():
            self.rss.setdefault(name, []).append(rss_bytes(pid))


def _shape(done: Sequence[Record]) -> dict[str, Any]:
    turns = [r for r in done if not r.joined and r.prompt_tokens]
    if not turns:
        return {}
    reuse = [r.reusable_tokens / r.prompt_tokens for r in turns]
    prompt = statistics.median(r.prompt_tokens for r in turns)
    output = statistics.median(r.output_tokens for r in turns if r.ok) if turns else 0
    return {
        "median_prompt_tokens": prompt,
        "median_output_tokens": output,
        "prompt_to_output": round(prompt / output, 1) if output else None,
        "share_turns_reuse_ge_90": round(sum(x >= 0.9 for x in reuse) / len(reuse), 4),
    }


def _errors(done: Sequence[Record]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in done:
        if not r.ok and not r.shed:
            out[r.error[:60]] = out.get(r.error[:60], 0) + 1
    return out


def _pick(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    h = parse_histogram(after.metrics, PICK).minus(parse_histogram(before.metrics, PICK))
    if h.count <= 0:
        return {}
    return {
        "picks": int(h.count),
        "p50_ms": format_ms(h.quantile(0.5), h.top),
        "p99_ms": format_ms(h.quantile(0.99), h.top),
        "mean_ms": format_ms(h.mean),
    }


def step_row(
    agents: int,
    before: Snapshot,
    after: Snapshot,
    records: Sequence[Record],
    sampler: WindowSampler,
    time_scale: float,
    length_factor: int,
    fleet_kv: int,
) -> dict[str, Any]:
    done = [r for r in records if before.at <= r.done < after.at]
    ok = [r for r in done if r.ok]
    wall = max(after.at - before.at, 1e-9)
    sim_minutes = wall * time_scale / 60.0
    cpu = {n: after.cpu.get(n, 0.0) - before.cpu.get(n, 0.0) for n in after.cpu}
    out_tokens = sum(r.output_tokens for r in ok)
    reusable = sum(r.reusable_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    prompt = sum(r.prompt_tokens for r in ok)
    n_ok = max(len(ok), 1)
    sim_delta = {k: after.sim.get(k, 0.0) - before.sim.get(k, 0.0) for k in after.sim}
    latency = [(r.done - r.sent) * time_scale for r in ok]
    ws_peak = max(sampler.working_set, default=0)
    return {
        "agents": agents,
        "sessions_mean": round(statistics.mean(sampler.sessions), 1) if sampler.sessions else 0,
        "wall_s": round(wall, 2),
        "answered": len(ok),
        "errors": len(done) - len(ok) - sum(r.shed for r in done),
        "error_kinds": _errors(done),
        "shed": sum(r.shed for r in done),
        "followups_404": sum(r.followup_404 for r in done),
        "requests_per_min": round(len(ok) / sim_minutes, 1),
        "output_tokens_per_min": round(out_tokens / sim_minutes, 1),
        "output_tokens_per_min_real": round(out_tokens * length_factor / sim_minutes),
        "wall_requests_per_s": round(len(ok) / wall, 2),
        "preemptions": int(sim_delta.get("preemptions", 0)),
        "preempting_pods": int(after.sim.get("preempting_pods", 0)),
        "hit_ratio": round(cached / prompt, 4) if prompt else None,
        "oracle_share": round(cached / reusable, 4) if reusable else None,
        "working_set_peak_tokens": ws_peak,
        "fleet_kv_over_working_set": round(fleet_kv / ws_peak, 3) if ws_peak else None,
        "turn_s_p50": round(percentile(latency, 0.5), 2),
        "turn_s_p99": round(percentile(latency, 0.99), 2),
        "cores": {n: round(v / wall, 3) for n, v in cpu.items()},
        "cpu_ms_per_req": {n: round(v * 1000 / n_ok, 3) for n, v in cpu.items()},
        "rss_mb_peak": {n: round(max(v) / 2**20, 1) for n, v in sampler.rss.items() if v},
        "pick": _pick(before, after),
        "shape": _shape(done),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
