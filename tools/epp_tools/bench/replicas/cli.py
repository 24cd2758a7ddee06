"""``epp bench replicas``: active-active EPP replicas under load, when Redis or a replica fails,
and ``epp --workers`` against one process. Each scenario runs on a fresh simulated fleet (its own
``epp sim`` process) with the built-in default config, the replicas behind one Envoy
(``epp_tools.stack.replicas``), and closed-loop agent sessions
(``epp_tools.bench.runner.agentload``)::

    epp bench replicas                                 # every scenario, about 3 minutes
    epp bench replicas --scenarios outage --out out/replicas

Scenarios:

- ``outage``: 2 replicas sharing through a local ``redis-server``. After ``--before`` seconds
  (default 12) of load, Redis is killed (SIGKILL) for ``--outage`` seconds (default 10), then
  started again, empty, on the same port; the load goes on ``--after`` seconds (default 14).
  Reported: failed requests over the whole run; the hit ratio before, during and after; the
  seconds from Redis's return until a 2-second window of requests reaches 95% of the
  pre-outage hit ratio; each replica's ``llm_d_epp_state_sync_errors_total``.
- ``restart``: 3 replicas; after ``--before`` seconds replica 3 is stopped (SIGTERM) and started
  again on its ports, and the load goes on ``--window`` seconds (default 10) after Envoy finds it
  SERVING again. Run twice:
  sharing through Redis (the new process replays the shared log before it reports ready) and
  learning alone (it starts cold). Reported per run: the restarted replica's hit ratio over its
  first ``--window`` seconds back and the other two's over the same seconds (from each replica's
  ``llm_d_epp_request_cached_tokens`` / ``llm_d_epp_request_input_tokens``, what the model
  servers reported for the requests that replica routed), and their ratio.
- ``workers``: the saturation throughput of one EPP process against ``epp --workers 2`` (sharing
  through Redis), ``--clients`` (default 48) closed-loop clients sending small unique chat
  requests (2 output tokens) for ``--duration`` seconds (default 15) to fast simulated pods
  (time scale 200). Reported: requests per second, the EPP's CPU (supervisor and workers), and
  the other processes' CPU: on a 2-core machine they share the cores with the EPP.

Everything it starts is stopped at the end or on Ctrl-C. Numbers vary from run to run: compare
within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.replicas.report import render
from epp_tools.bench.runner.agentload import (
    AgentLoad,
    agent_sessions,
    between,
    failed,
    failure_kinds,
    hit_ratio,
    recovery_seconds,
    windows,
)
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec
from epp_tools.stack.eppconfig import epp_config_text
from epp_tools.stack.procs import tree_cpu_seconds
from epp_tools.stack.replicas import EppSet, SetupError

SCENARIOS = ("outage", "restart", "workers")
AGENT_FLEET = FleetSpec(pods=4, num_gpu_blocks=4_000, max_model_len=65_536, time_scale=10.0)
FAST_FLEET = FleetSpec(pods=4, time_scale=200.0)
RECOVERED = 0.95
SESSIONS = 640  # enough for the longest default scenario (about 90 requests a second)


def log(message: str) -> None:
    print(f"bench replicas: {message}", flush=True)


async def _sleep_until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.perf_counter()))


class _Stage:
    """A fleet and an EPP set, started in a work directory and stopped on exit."""

    def __init__(self, workdir: Path, fleet: FleetSpec, **epp_kw: Any) -> None:
        self.sim = SimProcess(fleet, workdir / "sim")
        self.workdir, self.epp_kw = workdir, epp_kw
        self.group: EppSet | None = None

    def __enter__(self) -> EppSet:
        self.sim.start()
        eps = self.workdir / "endpoints.yaml"
        eps.write_text(endpoints_yaml(self.sim))
        text = epp_config_text(eps, ())
        try:
            self.group = EppSet(self.workdir / "epp", text, **self.epp_kw).start()
        except BaseException:
            self.sim.stop()
            raise
        return self.group

    def __exit__(self, *exc: object) -> None:
        if self.group is not None:
            self.group.stop()
        self.sim.stop()


def _metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _tokens(group: EppSet, i: int) -> tuple[float, float]:
    text = group.scrape(i)
    return (
        _metric_sum(text, "llm_d_epp_request_cached_tokens_sum"),
        _metric_sum(text, "llm_d_epp_request_input_tokens_sum"),
    )


async def outage(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sessions = agent_sessions(SESSIONS, 8, args.seed, AGENT_FLEET)
    total = args.before + args.outage + args.after
    with _Stage(workdir, AGENT_FLEET, replicas=2, shared=True) as group:
        assert group.redis is not None
        await warm_up(group.url)
        load = AgentLoad(group.url, sessions, clients=args.clients_agents)
        start = time.perf_counter()
        task = asyncio.create_task(load.run(start, start + total))
        await _sleep_until(start + args.before)
        group.redis.kill()
        log(f"redis killed at {time.perf_counter() - start:.1f}s")
        await _sleep_until(start + args.before + args.outage)
        group.redis.start()
        back = time.perf_counter() - start
        log(f"redis back at {back:.1f}s")
        outcomes = await task
        errors = [_metric_sum(group.scrape(i), "llm_d_epp_state_sync_errors_total") for i in (0, 1)]
    killed = float(args.before)
    baseline = hit_ratio(between(outcomes, 2.0, killed))
    return {
        "requests": len(outcomes),
        "failed": failed(outcomes),
        "failures": failure_kinds(outcomes),
        "exhausted": load.exhausted,
        "killed_at": killed,
        "back_at": round(back, 2),
        "hit_before": baseline,
        "hit_during": hit_ratio(between(outcomes, killed, back)),
        "hit_after": hit_ratio(between(outcomes, back, total)),
        "recovery_s": recovery_seconds(
            outcomes, back, RECOVERED * baseline, limit=max(0.0, total - back - 2.0)
        ),
        "sync_errors": errors,
        "windows": windows(outcomes, 1.0, total),
    }


async def _restart_run(args: argparse.Namespace, workdir: Path, shared: bool) -> dict[str, Any]:
    sessions = agent_sessions(SESSIONS, 8, args.seed, AGENT_FLEET)
    # a rolling restart: SIGTERM, readiness off, in-flight requests finish (drain), exit
    drain = ("--drain-timeout", "3s")
    with _Stage(workdir, AGENT_FLEET, replicas=3, shared=shared, extra_args=drain) as group:
        await warm_up(group.url)
        load = AgentLoad(group.url, sessions, clients=args.clients_agents)
        start = time.perf_counter()
        task = asyncio.create_task(load.run(start, start + 600.0))
        try:
            await _sleep_until(start + args.before)
            await asyncio.to_thread(group.stop_replica, 2)
            await asyncio.to_thread(group.start_replica, 2)
            back = await asyncio.to_thread(group.wait_healthy, 3)
            before = [_tokens(group, i) for i in range(3)]
            await asyncio.sleep(args.window)
            after = [_tokens(group, i) for i in range(3)]
        finally:
            load.supply = ()  # no new session; the agents finish their current turn
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    delta = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before, strict=True)]
    mine = delta[2][0] / delta[2][1] if delta[2][1] else math.nan
    others_in = delta[0][1] + delta[1][1]
    others = (delta[0][0] + delta[1][0]) / others_in if others_in else math.nan
    outcomes = load.outcomes
    return {
        "shared": shared,
        "requests": len(outcomes),
        "failed": failed(outcomes),
        "failures": failure_kinds(outcomes),
        "back_after_s": round(back - start - args.before, 2),
        "restarted_hit": mine,
        "others_hit": others,
        "ratio": mine / others if others else math.nan,
        "restarted_prompt_tokens": delta[2][1],
        "window_s": args.window,
    }


async def restart(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    runs = [await _restart_run(args, workdir / k, k == "shared") for k in ("shared", "alone")]
    return {"runs": runs}


def _small_requests(n: int) -> list[list[BenchRequest]]:
    return [
        [BenchRequest(f"s{i}", 0, MODEL, ({"role": "user", "content": f"q{i} hello"},), 2)]
        for i in range(n)
    ]


async def _workers_run(args: argparse.Namespace, workdir: Path, workers: int) -> dict[str, Any]:
    kw: dict[str, Any] = {"workers": workers, "shared": workers > 1}
    if workers > 1:
        kw["envoy_max_streams"] = 4
    stage = _Stage(workdir, FAST_FLEET, **kw)
    with stage as group:
        await warm_up(group.url)
        procs = {"epp": group.procs[0].pid, "sim": stage.sim.proc.pid if stage.sim.proc else 0}
        procs |= {k: v for k, v in group.pids().items() if k in ("envoy", "redis")}
        load = AgentLoad(group.url, _small_requests(200_000), clients=args.clients)
        cpu0 = {k: tree_cpu_seconds(p) for k, p in procs.items()}
        me0 = _own_cpu()
        start = time.perf_counter()
        await load.run(start, start + args.duration)
        wall = time.perf_counter() - start
        cpu = {k: tree_cpu_seconds(p) - cpu0[k] for k, p in procs.items()}
        cpu["client"] = _own_cpu() - me0
    ok = len(load.outcomes) - failed(load.outcomes)
    return {
        "workers": workers,
        "requests": len(load.outcomes),
        "failed": failed(load.outcomes),
        "req_per_s": ok / wall,
        "cpu_cores": {k: v / wall for k, v in cpu.items()},
        "epp_cpu_ms_per_req": 1000.0 * cpu["epp"] / ok if ok else math.nan,
    }


def _own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def workers(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    runs = [await _workers_run(args, workdir / f"w{n}", n) for n in (1, 2)]
    return {"runs": runs, "cpus": _cpus()}


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp bench replicas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated")
    p.add_argument("--out", default="out/bench-replicas", help="report directory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--before", type=float, default=12.0, help="load before the failure (s)")
    p.add_argument("--outage", type=float, default=10.0, help="seconds Redis stays down")
    p.add_argument("--after", type=float, default=14.0, help="load after Redis returns (s)")
    p.add_argument(
        "--window", type=float, default=10.0, help="restart: seconds measured after it is back"
    )
    p.add_argument("--clients-agents", type=int, default=8, help="agent sessions in flight")
    p.add_argument("--clients", type=int, default=48, help="clients of the workers scenario")
    p.add_argument("--duration", type=float, default=15.0, help="workers scenario run (s)")
    return p


SCENARIO_FUNCS = {"outage": outage, "restart": restart, "workers": workers}


async def _run(args: argparse.Namespace, names: Sequence[str]) -> dict[str, Any]:
    report: dict[str, Any] = {"cpus": _cpus(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with tempfile.TemporaryDirectory(prefix="epp-bench-replicas-") as tmp:
        for name in names:
            log(f"scenario {name}")
            report[name] = await SCENARIO_FUNCS[name](args, Path(tmp) / name)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")
    if (
        min(args.before, args.outage, args.after, args.duration, args.window) <= 0
        or args.clients < 1
    ):
        parser.error(
            "--before, --outage, --after, --duration, --window must be > 0, --clients >= 1"
        )
    try:
        report = asyncio.run(_run(args, names))
    except SetupError as exc:
        print(f"epp bench replicas: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "\nepp bench replicas: interrupted; everything it started is stopped", file=sys.stderr
        )
        return 130
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    text = render(report)
    (out / "report.md").write_text(text)
    print(text)
    return 0
