"""``epp bench rate``: per-pick latency and CPU of the EPP at fixed request rates (a sweep).

For each EPP variant of ``--servers`` (``epp``: the EPP as shipped, the only one today; the report
keeps a row group per variant) it starts a cold simulated fleet of ``--pods`` pods (one ``epp sim``
process), the EPP with ``--config`` (default ``deploy/configs/upstream-default.yaml``: llm-d's
built-in default profile, queue 2, kv-cache 2, prefix 3, and its 50 ms metrics scraping) pointed at
those pods by file discovery, and Envoy (``full-duplex``) in front. The EPP's threads are pinned to
CPU ``--epp-cpu`` (default: the last one) and Envoy, the simulator and this client to the others
(``--no-isolate``: they may use every CPU), so the EPP has one core to itself as far as the
benchmark's own processes go (other processes on the machine are not moved). After one warm-up
request it measures the EPP's idle CPU for ``--idle`` seconds, then runs each rate of ``--rates``
for ``--duration`` seconds, open loop (``--arrivals`` poisson or uniform,
``epp_tools.bench.rate.load``), one step after the other.

Per step it reports what the step added, from ``/metrics`` read before and after it:

* **per pick**: ``llm_d_epp_scheduler_e2e_duration_seconds``, the time of one
  ``Scheduler.schedule`` call (profiles, filters, scorers, picker), what llm-d-router records
  and its perf studies report as scheduling latency (the 78.55 ms P95 at 500 QPS of
  ``high_qps_small_token``); percentiles interpolated inside buckets as upstream's script does;
* **EPP processing**: ``llm_d_epp_request_processing_duration_seconds``, request headers until
  the body is routed (parsing, producers, scheduling, and every wait for the event loop in
  between: where a busy EPP queues work, which ``schedule`` alone never sees);
* through Envoy, client side: the achieved rate (answers per second of the step's ``--duration``),
  latency percentiles to the last byte, errors, and the client's
  send lag (p99; when it is large the client, not the target, set the rate);
* CPU seconds of the EPP, Envoy, the simulator and this client over the step (``/proc``), per
  answered request and as cores; the EPP's also net of its idle rate; and the seconds per
  second the EPP's threads spent runnable but waiting for their CPU (``schedstat``, summed over
  threads, so it can exceed 1): on a shared machine, what other processes took from the EPP.

The step is marked ``reached`` when every request was answered 200, the achieved rate is at
least 95% of the target and the client's p99 send lag is under 50 ms. ``results.json`` and
``report.md`` go to ``--out``. Traffic goes to 127.0.0.1 only; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from epp_tools.bench.fleet import SimProcess, endpoints_yaml
from epp_tools.bench.rate.load import bodies, open_loop, pin, runqueue_wait_seconds
from epp_tools.bench.rate.stats import ARRIVAL_KINDS, arrivals
from epp_tools.bench.rate.summary import Reading, report_md, step_row
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.eppconfig import CONFIGS, epp_config_text
from epp_tools.stack.procs import cpu_seconds
from epp_tools.stack.replicas import EppSet

DEFAULT_CONFIG = CONFIGS / "upstream-default.yaml"
SERVERS: dict[str, list[str]] = {"epp": []}
"""Variant name → the EPP's extra flags."""


@dataclass(frozen=True)
class RateOptions:
    rates: tuple[float, ...]
    duration: float = 10.0
    servers: tuple[str, ...] = ("epp",)
    pods: int = 10
    config: Path = DEFAULT_CONFIG
    epp_cpu: int = -1
    arrivals: str = "poisson"
    seed: int = 1
    max_tokens: int = 100
    stream: bool = False
    idle: float = 3.0
    isolate: bool = True
    time_scale: float = 1.0
    timeout: float = 10.0
    out: Path = Path("out/bench-rate")

    def cpus(self) -> tuple[set[int], set[int]]:
        """(the EPP's CPU, everything else's) among the CPUs this process may use."""
        allowed = sorted(os.sched_getaffinity(0))
        epp = allowed[self.epp_cpu] if self.epp_cpu < 0 else self.epp_cpu
        if epp not in allowed:
            raise ValueError(f"--epp-cpu {self.epp_cpu}: not among the usable CPUs {allowed}")
        others = set(allowed) - {epp} if self.isolate else set(allowed)
        return {epp}, others or {epp}


def log(message: str) -> None:
    print(f"bench rate: {message}", flush=True)


async def _scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as r:
        return await r.text()


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    out = {name: cpu_seconds(pid) for name, pid in pids.items()}
    out["client"] = time.process_time()
    return out


async def _reading(http: aiohttp.ClientSession, url: str, pids: dict[str, int]) -> Reading:
    text = await _scrape(http, url)
    return Reading(text, _cpu(pids), time.perf_counter(), runqueue_wait_seconds(pids["epp"]))


async def _idle_cores(http: aiohttp.ClientSession, url: str, pid: int, seconds: float) -> float:
    """The EPP's CPU with no traffic (its scraping and background tasks), in cores."""
    if seconds <= 0:
        return 0.0
    c0, t0 = cpu_seconds(pid), time.perf_counter()
    await asyncio.sleep(seconds)
    await _scrape(http, url)  # the scrape's own cost counts, as it does around every step
    return (cpu_seconds(pid) - c0) / (time.perf_counter() - t0)


async def _sweep(
    server: str, group: EppSet, sim_pid: int, opts: RateOptions
) -> list[dict[str, Any]]:
    pids = {n: p for n, p in group.pids().items() if n in ("epp", "envoy")}
    pids["sim"] = sim_pid
    metrics = group.metrics_url(0)
    rows = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        idle = await _idle_cores(http, metrics, pids["epp"], opts.idle)
        log(f"{server}: EPP idle {idle * 100:.1f}% of a core")
        for k, rate in enumerate(opts.rates):
            times = arrivals(rate, opts.duration, opts.arrivals, opts.seed + k)
            payloads = bodies(len(times), opts.seed * 1000 + k, max_tokens=opts.max_tokens,
                              stream=opts.stream)  # fmt: skip
            before = await _reading(http, metrics, pids)
            shots, wall = await open_loop(
                group.url, payloads, times, timeout=opts.timeout, stream=opts.stream
            )
            after = await _reading(http, metrics, pids)
            row = step_row(server, rate, opts.duration, shots, wall, before, after, idle)
            row["load_average_1m"] = round(os.getloadavg()[0], 1)
            log(_describe(row))
            rows.append(row)
    return rows


def _describe(row: dict[str, Any]) -> str:
    return (
        f"{row['server']} @ {row['target_rate']:g}/s: {row['achieved_rate']:.0f}/s "
        f"({'reached' if row['reached'] else 'NOT reached'}), {row['errors']} errors, pick "
        f"p50/p95/p99 {row['pick_ms']['p50']}/{row['pick_ms']['p95']}/{row['pick_ms']['p99']} "
        f"ms, processing p95 {row['processing_ms']['p95']} ms, latency p95 "
        f"{row['latency_ms']['p95']:.1f} ms, EPP {row['cpu_ms_per_req']['epp']:.2f} ms CPU/req "
        f"({row['cores']['epp']:.2f} cores), client lag p99 {row['lag_p99_ms']:.1f} ms"
    )


async def run_server(server: str, opts: RateOptions, workdir: Path) -> dict[str, Any]:
    """One server's sweep on a fleet and an EPP of its own (stopped at the end)."""
    epp_cpus, others = opts.cpus()
    pin(os.getpid(), others)
    sim = SimProcess(FleetSpec(pods=opts.pods, time_scale=opts.time_scale), workdir)
    group: EppSet | None = None
    try:
        sim.start()
        sim_pid = sim.proc.pid if sim.proc else 0
        pin(sim_pid, others)
        eps = workdir / "endpoints.yaml"
        eps.write_text(endpoints_yaml(sim))
        text = epp_config_text(eps, (), opts.config.read_text())
        group = EppSet(workdir, text, extra_args=SERVERS[server]).start()
        pids = group.pids()
        pin(pids["epp"], epp_cpus)
        pin(pids.get("envoy", 0), others)
        await warm_up(group.url)
        rows = await _sweep(server, group, sim_pid, opts)
        return {"server": server, "status": "ok", "steps": rows}
    except Exception as exc:
        log(f"{server}: failed: {type(exc).__name__}: {exc}")
        return {"server": server, "status": "failed", "reason": f"{exc}"[:500], "steps": []}
    finally:
        if group is not None:
            group.stop()
        sim.stop()


async def run(opts: RateOptions) -> dict[str, Any]:
    epp_cpus, others = opts.cpus()
    results = [await run_server(s, opts, opts.out / "work" / s) for s in opts.servers]
    return {
        "run": {
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "rates": list(opts.rates),
            "duration_s": opts.duration,
            "arrivals": opts.arrivals,
            "pods": opts.pods,
            "config": str(opts.config),
            "epp_cpu": sorted(epp_cpus),
            "other_cpus": sorted(others),
            "max_tokens": opts.max_tokens,
            "stream": opts.stream,
            "time_scale": opts.time_scale,
            "load_average": list(os.getloadavg()),
        },
        "servers": results,
    }


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if not values or any(v <= 0 for v in values) or len(values) > 20:
        raise argparse.ArgumentTypeError("1 to 20 rates, each > 0")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp bench rate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--rates",
        type=_floats,
        default=(100.0, 250.0, 500.0, 750.0),
        help="requests per second, comma-separated (default 100,250,500,750)",
    )
    p.add_argument("--duration", type=float, default=10.0, help="seconds per rate (default 10)")
    p.add_argument("--servers", default="epp", help="EPP variants (default epp)")
    p.add_argument("--pods", type=int, default=10, help="simulated pods (default 10)")
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="EndpointPickerConfig")
    p.add_argument("--epp-cpu", type=int, default=-1, help="CPU of the EPP (default: the last)")
    p.add_argument("--arrivals", choices=ARRIVAL_KINDS, default="poisson")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=100, help="output tokens per request")
    p.add_argument("--stream", action="store_true", help="streamed answers (a chunk per token)")
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measurement")
    p.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin Envoy, the simulator and the client off the EPP's CPU (default)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="simulator speed-up (default 1: 6 ms decode steps, ~0.6 s per 100-token answer)",
    )
    p.add_argument("--out", type=Path, default=Path("out/bench-rate"))
    return p  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    servers = tuple(s.strip() for s in args.servers.split(",") if s.strip())
    if not servers or any(s not in SERVERS for s in servers):
        parser.error(f"--servers: among {', '.join(SERVERS)}")
    if not 0 < args.duration <= 600 or not 1 <= args.pods <= 200 or args.max_tokens < 1:
        parser.error("--duration in (0, 600], --pods in [1, 200], --max-tokens >= 1")
    if not args.config.is_file():
        parser.error(f"--config {args.config}: no such file")
    opts = RateOptions(args.rates, args.duration, servers, args.pods, args.config, args.epp_cpu,
                       args.arrivals, args.seed, args.max_tokens, args.stream, args.idle,
                       args.isolate, args.time_scale, out=args.out)  # fmt: skip
    try:
        opts.cpus()
    except ValueError as exc:
        parser.error(str(exc))
    report = asyncio.run(run(opts))
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "results.json").write_text(json.dumps(report, indent=2))
    markdown = report_md(report)
    (opts.out / "report.md").write_text(markdown)
    print(markdown)
    return 0 if all(s["status"] == "ok" for s in report["servers"]) else 1
