"""The ramp of ``epp bench scale``: more and more live agents against one target, step by step.

For each target: a cold simulated fleet (one ``epp sim`` process, ``fleet_for`` the largest step),
the target in front of it (``epp_tools.bench.runner.targets``: the EPP behind Envoy, Envoy round
robin, a peer router), one warm-up request, then for each step of ``steps``:

1. join: start the agents the step adds (``AgentPool.add``), spread over ``join_s`` simulated
   seconds, and wait until every new agent's first turn has been prefilled, its first token
   streamed (at most ``join_cap_s``): the new agents' first turns carry their whole context, the
   burst of prefill the step adds, and are not measured. Waiting for their last token instead
   would wait for the longest of a thousand answers, minutes of decode that are steady load;
2. settle ``settle_s`` simulated seconds;
3. measure ``window_s`` simulated seconds: a ``Snapshot`` before and after, the working set, the
   live sessions and the target's RSS sampled every second; the row is ``probe.step_row``.

After the last step, ``hold_minutes`` (wall minutes, 0 = none) more are run at that step with the
target's RSS sampled every ``HOLD_SAMPLE_S`` seconds: the RSS trend over the hold.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.runner import targets
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.runner.run import idle_cores
from epp_tools.bench.scale.agents import MAIN_OBJECTIVE, SUB_OBJECTIVE
from epp_tools.bench.scale.drive import REQUEST_TIMEOUT_S, AgentPool
from epp_tools.bench.scale.probe import (
    Snapshot,
    WindowSampler,
    snapshot,
    state_gauges,
    step_row,
    tracemalloc_command,
)
from epp_tools.bench.scale.shape import AgentShape, Scaling, fleet_for, working_set_tokens
from epp_tools.bench.workloads.spec import FleetSpec, Workload
from epp_tools.stack.procs import rss_bytes

WORK = Path("out/bench-scale")
"""Where the processes' logs and files go (the reports go to ``--out``, shown by the docs)."""
HOLD_SAMPLE_S = 10.0
IDLE_S = 3.0
"""Wall seconds the target's idle CPU (scraping, background tasks) is measured before the ramp."""
OBJECTIVES = ((MAIN_OBJECTIVE, 0), (SUB_OBJECTIVE, -1))
"""Main-agent turns at priority 0, sub-agent turns at -1 (shed first under flow control)."""


@dataclass(frozen=True)
class RampOptions:
    steps: tuple[int, ...] = (250, 500, 1000, 2000, 3000)
    targets: tuple[str, ...] = ("epp",)
    pods: int = 16
    kv_factor: float = 1.2
    shape: AgentShape = field(default_factory=AgentShape)
    scaling: Scaling = field(default_factory=Scaling)
    join_s: float = 20.0
    join_cap_s: float = 240.0
    settle_s: float = 10.0
    window_s: float = 40.0
    hold_minutes: float = 0.0
    tracemalloc: int = 0
    """Frames the EPP's allocation sites are recorded with (``PYTHONTRACEMALLOC``; 0 = off): the
    hold then reports the sites whose memory grew the most over it."""
    seed: int = 1
    out: Path = Path("docs/benchmarks/scale")

    def fleet(self) -> FleetSpec:
        return fleet_for(self.shape, self.scaling, max(self.steps), self.pods, self.kv_factor)


def log(message: str) -> None:
    print(f"bench scale: {message}", flush=True)


GATEWAY_TIMEOUT_S = REQUEST_TIMEOUT_S
"""The Envoy targets' route timeout in simulated seconds: as long as the client waits (600 s;
``epp envoy-config``'s default is 300 s, shorter than the longest turns of agents at a large batch:
``--route-timeout`` sets it), and in simulated time, so slowed turns are not cut early."""


def _workload(fleet: FleetSpec, time_scale: float) -> Workload:
    return Workload(
        name="scale",
        title="coding agents at scale",
        description="",
        requests=[],
        fleet=fleet,
        concurrency=0,
        objectives=OBJECTIVES,
        gateway_timeout=GATEWAY_TIMEOUT_S / time_scale,
    )


async def _sleep_sim(seconds: float, scaling: Scaling) -> None:
    await asyncio.sleep(seconds / scaling.time_scale)


async def _join(pool: AgentPool, opts: RampOptions) -> float:
    """Wait until each live main agent's first turn has been prefilled (``AgentPool.prefilled``).
    Returns the simulated seconds it took."""
    t0 = time.perf_counter()
    deadline = t0 + opts.join_cap_s / opts.scaling.time_scale
    while time.perf_counter() < deadline:
        if all(a.is_sub or a.name in pool.prefilled for a in pool.live.values()):
            break
        await asyncio.sleep(0.5)
    return (time.perf_counter() - t0) * opts.scaling.time_scale


async def _window(
    pool: AgentPool, running: targets.Running, sim: SimProcess, opts: RampOptions, agents: int
) -> dict[str, Any]:
    pids = dict(running.processes)
    sampler = WindowSampler()
    before: Snapshot = await snapshot({**pids, "sim": _pid(sim)}, running.metrics_url, sim)
    end = before.at + opts.window_s / opts.scaling.time_scale
    while time.perf_counter() < end:
        sampler.sample(pool.working_set(), len(pool.live), pids)
        await asyncio.sleep(min(1.0, max(0.0, end - time.perf_counter())))
    after = await snapshot({**pids, "sim": _pid(sim)}, running.metrics_url, sim)
    fleet_kv = sum(opts.fleet().pod_kv_tokens)
    return step_row(agents, before, after, pool.records, sampler, opts.scaling.time_scale,
                    opts.scaling.length_factor, fleet_kv)  # fmt: skip


def _net_cpu(row: dict[str, Any], idle: dict[str, float]) -> dict[str, float]:
    """CPU ms per answered request net of each process's idle rate."""
    n = max(row["answered"], 1)
    return {
        name: round(max(0.0, row["cores"][name] - cores) * row["wall_s"] * 1000 / n, 3)
        for name, cores in idle.items()
        if name in row["cores"]
    }


def _pid(sim: SimProcess) -> int:
    return sim.proc.pid if sim.proc is not None else 0


async def _hold(
    pool: AgentPool, running: targets.Running, minutes: float, traced: bool = False
) -> dict[str, Any]:
    """Keep the last step running ``minutes``; the target's RSS and the EPP's bounded state
    (``probe.STATE_GAUGES``) every ``HOLD_SAMPLE_S``; with ``traced`` (the EPP records its
    allocation sites) the sites whose memory grew the most from the hold's start to its end."""
    samples: list[tuple[float, dict[str, int]]] = []
    state: list[tuple[float, dict[str, float]]] = []
    if traced:
        await tracemalloc_command(running.metrics_url, "baseline")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < minutes * 60:
        at = round(time.perf_counter() - t0, 1)
        samples.append((at, {n: rss_bytes(p) for n, p in running.processes.items()}))
        gauges = await state_gauges(running.metrics_url)
        # the agents' contexts grow turn by turn until compaction: what requests in flight hold
        gauges["working_set_tokens"] = float(pool.working_set())
        state.append((at, gauges))
        await asyncio.sleep(HOLD_SAMPLE_S)
    errors = sum(1 for r in pool.records if r.done >= t0 and not r.ok and not r.shed)
    out = {"minutes": minutes, "errors": errors, "rss_samples": samples, "state_samples": state}
    if traced:
        out["tracemalloc"] = await tracemalloc_command(running.metrics_url, "diff")
    return out


def _write_records(pool: AgentPool, workdir: Path) -> None:
    """Every answer of the run, one JSON line each (times relative to the pool's start), next to
    the processes' logs: what an error or a slow turn was, when and where."""
    with (workdir / "records.jsonl").open("w") as out:
        for r in pool.records:
            row = dataclasses.asdict(r)
            row["sent"] = round(r.sent - pool.t0, 3)
            row["done"] = round(r.done - pool.t0, 3)
            out.write(json.dumps(row) + "\n")


def _describe(target: str, row: dict[str, Any]) -> str:
    pick = row["pick"]
    share = row["oracle_share"]
    return (
        f"{target} @ {row['agents']} agents: {row['requests_per_min']:.0f} req/min, "
        f"{row['output_tokens_per_min']:.0f} out tok/min (sim), {row['errors']} errors, "
        f"{row['shed']} shed, {row['preemptions']} preemptions, "
        f"{'-' if share is None else f'{share:.1%}'} of oracle, "
        f"cores {row['cores']}, pick p50/p99 {pick.get('p50_ms', '-')}/{pick.get('p99_ms', '-')} "
        f"ms, RSS {row['rss_mb_peak']} MB, KV/WS {row['fleet_kv_over_working_set']}"
    )


async def run_target(key: str, opts: RampOptions, workdir: Path) -> dict[str, Any]:
    """The whole ramp against target ``key`` on a fleet of its own."""
    fleet = opts.fleet()
    sim = SimProcess(fleet, workdir)
    running: targets.Running | None = None
    rows: list[dict[str, Any]] = []
    hold: dict[str, Any] = {}
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        sim.start()
        env = {"PYTHONTRACEMALLOC": str(opts.tracemalloc)} if opts.tracemalloc else None
        workload = _workload(fleet, opts.scaling.time_scale)
        running = targets.start(key, sim, workload, workdir, epp_env=env)
        await warm_up(running.url)
        idle = await idle_cores(running, IDLE_S)
        async with AgentPool(running.url, opts.shape, opts.scaling, opts.seed) as pool:
            for agents in opts.steps:
                pool.add(max(0, agents - pool.started), opts.join_s)
                joined = await _join(pool, opts)
                await _sleep_sim(opts.settle_s, opts.scaling)
                row = await _window(pool, running, sim, opts, agents)
                row["join_s"] = round(joined, 1)
                row["idle_cores"] = idle
                row["cpu_ms_per_req_net"] = _net_cpu(row, idle)
                log(_describe(key, row))
                rows.append(row)
            if opts.hold_minutes > 0:
                hold = await _hold(pool, running, opts.hold_minutes, opts.tracemalloc > 0)
            _write_records(pool, workdir)
        return {"target": key, "label": targets.label(key), "status": "ok", "steps": rows,
                "hold": hold}  # fmt: skip
    except Exception as exc:
        log(f"{key}: failed: {type(exc).__name__}: {exc}")
        return {"target": key, "label": targets.label(key), "status": "failed",
                "reason": f"{type(exc).__name__}: {exc}"[:500], "steps": rows}  # fmt: skip
    finally:
        if running is not None:
            running.stop()
        sim.stop()


async def run(opts: RampOptions) -> dict[str, Any]:
    unavailable = {}
    for key in opts.targets:
        try:
            targets.prepare(key)
        except Exception as exc:
            unavailable[key] = str(exc)
            log(f"{key}: not available: {exc}")
    results = []
    for key in opts.targets:
        if key in unavailable:
            results.append({"target": key, "label": targets.label(key), "status": "skipped",
                            "reason": unavailable[key], "steps": []})  # fmt: skip
            continue
        workdir = WORK / key.replace(":", "-").replace("/", "_")
        results.append(await run_target(key, opts, workdir))
    return {"run": run_header(opts), "targets": results}


def run_header(opts: RampOptions) -> dict[str, Any]:
    fleet = opts.fleet()
    return {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "steps": list(opts.steps),
        "kv_factor": opts.kv_factor,
        "working_set_estimate_tokens": working_set_tokens(
            opts.shape, opts.scaling, max(opts.steps)
        ),
        "fleet": fleet.as_json(),
        "fleet_kv_tokens": sum(fleet.pod_kv_tokens),
        "scaling": opts.scaling.as_json(),
        "shape": dict(vars(opts.shape)),
        "join_s": opts.join_s,
        "settle_s": opts.settle_s,
        "window_s": opts.window_s,
        "seed": opts.seed,
    }


def steps_text(steps: Sequence[int]) -> str:
    return ", ".join(f"{n:,}" for n in steps)
