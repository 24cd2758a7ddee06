"""``epp bench latency``: the SLO attainment latency-predicted routing buys against upstream's
default scheduling, and how well the in-process model predicts, on a simulated fleet through
Envoy.

Every target runs the same seeded open-loop workload (Poisson arrivals, streamed chat) on a cold
fleet of its own; each request carries its class's SLOs (``x-llm-d-slo-ttft-ms``,
``x-llm-d-slo-tpot-ms``, wall-clock: the simulated value divided by the time scale). Classes
(shares of the requests; times in simulated ms):

==========  =====  ===========================================================  ======  =====
class       share  prompt                                                       TTFT    TPOT
==========  =====  ===========================================================  ======  =====
``chat``    60%    one of 8 shared 1,500-token system prompts (Zipf popularity)  800     60
                   and a 40-120 token question; 48 output tokens
``doc``     20%    a unique 3,000-5,000 token document; 64 output tokens        3,000   80
``short``   20%    a unique 60-150 token prompt; 24 output tokens               400     60
==========  =====  ===========================================================  ======  =====

The fleet (4 pods, 4,000 prefill tokens/s, 20 ms decode steps plus 0.4 ms per sequence, 32
sequences per batch) makes a long uncached document hold its pod's prefill for a second: where a
request lands decides its TTFT, which is what the predictor's features (uncached tokens, prefill
tokens in flight, queue, batch) describe and a count of queued requests does not.

Targets (``--targets``, default all three): ``epp:deploy/configs/upstream-default.yaml`` (llm-d's
default profile: queue 2, kv-cache 2, prefix 3, max-score picker),
``epp:deploy/configs/llm-d-latency-predictor.yaml`` (llm-d's latency-predictor profile in
streaming mode: two prefix-affinity gates, the SLO tier filter, ``latency-scorer`` packing onto
the endpoint closest to the SLO, weighted random picker) and
``epp:deploy/configs/latency-slo.yaml`` (the tier filter, ``latency-scorer`` with the most
headroom, max-score picker); both latency profiles without a sidecar, so with the in-process
model. Any ``epp:<config.yaml>`` may be named.

Per target, over the requests arriving after the lead-in (the first ``--lead-in`` share of the
run, which also trains the model): **SLO attainment**, the share of requests answered whose TTFT
and TPOT (the client's mean gap between content chunks) both met their SLOs, overall and per
class; the share meeting TTFT alone; TTFT p50/p90/p99 (simulated ms); failed and rejected
requests. For an EPP running ``predicted-latency-producer`` its ``predictionError`` (from
``/debug/plugins/state``): over every request it predicted and then measured, the mean absolute
error (wall ms and simulated ms), the mean absolute percentage error and the median and p90 of
the absolute percentage error, of the prediction for the chosen endpoint against the EPP's own
measurement (dispatch to first chunk; the client's TTFT adds Envoy and the network).

``results.json`` and ``report.md`` go to ``--out`` (default ``docs/benchmarks/latency``). TTFT is
wall-clock on a shared machine: compare targets within one run. Traffic goes to 127.0.0.1 only;
every wait is bounded (``--deadline`` per target).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp

from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.runner import driver, targets
from epp_tools.bench.runner.driver import warm_up
from epp_tools.bench.runner.run import log, machine
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec, Workload
from epp_tools.bench.workloads.text import percentile, words

ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_TARGETS: Final = (
    "epp:deploy/configs/upstream-default.yaml",
    "epp:deploy/configs/llm-d-latency-predictor.yaml",
    "epp:deploy/configs/latency-slo.yaml",
)
FLEET: Final = FleetSpec(
    pods=4,
    num_gpu_blocks=20000,
    max_num_seqs=32,
    prefill_tokens_per_s=4000.0,
    decode_base_ms=20.0,
    decode_per_seq_ms=0.4,
    time_scale=2.0,
)
SLO_TTFT: Final = "x-llm-d-slo-ttft-ms"
SLO_TPOT: Final = "x-llm-d-slo-tpot-ms"


@dataclass(frozen=True)
class SLOClass:
    name: str
    share: float
    prefixes: int
    prefix_words: int
    unique_words: tuple[int, int]
    output_tokens: int
    ttft_ms: float
    tpot_ms: float


CLASSES: Final = (
    SLOClass("chat", 0.6, 8, 1500, (40, 120), 48, 800.0, 60.0),
    SLOClass("doc", 0.2, 0, 0, (3000, 5000), 64, 3000.0, 80.0),
    SLOClass("short", 0.2, 0, 0, (60, 150), 24, 400.0, 60.0),
)


@dataclass(frozen=True)
class SLORequest(BenchRequest):
    """A request with SLO headers (wall-clock milliseconds)."""

    slo_ttft_ms: float = 0.0
    slo_tpot_ms: float = 0.0

    def headers(self) -> dict[str, str]:
        return {
            **super().headers(),
            SLO_TTFT: f"{self.slo_ttft_ms:g}",
            SLO_TPOT: f"{self.slo_tpot_ms:g}",
        }


def build_requests(rate: float, duration: float, seed: int, fleet: FleetSpec) -> list[SLORequest]:
    """Poisson arrivals at ``rate`` per simulated second over ``duration`` simulated seconds."""
    rng = random.Random(seed)
    prefixes = {c.name: [words(rng, c.prefix_words) for _ in range(c.prefixes)] for c in CLASSES}
    zipf = [1.0 / (k + 1) for k in range(max(c.prefixes for c in CLASSES))]
    out: list[SLORequest] = []
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration:
            return out
        c = rng.choices(CLASSES, weights=[k.share for k in CLASSES])[0]
        messages = []
        if c.prefixes:
            system = rng.choices(prefixes[c.name], weights=zipf[: c.prefixes])[0]
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": words(rng, rng.randint(*c.unique_words))})
        out.append(
            SLORequest(
                session=f"{c.name}-{len(out)}",
                turn=0,
                model=MODEL,
                messages=tuple(messages),
                max_tokens=c.output_tokens,
                at=at,
                slo_ttft_ms=c.ttft_ms / fleet.time_scale,
                slo_tpot_ms=c.tpot_ms / fleet.time_scale,
            )
        )


def _class_of(request: BenchRequest) -> str:
    return request.session.rpartition("-")[0]


def attainment(
    outcomes: Sequence[driver.Outcome], requests: Sequence[SLORequest], fleet: FleetSpec
) -> dict[str, Any]:
    """SLO attainment, overall and per class, and TTFT percentiles (simulated ms)."""
    per_class: dict[str, list[tuple[bool, bool, float]]] = {}
    failed = rejected = 0
    for out, req in zip(outcomes, requests, strict=True):
        if out.status == 429:
            rejected += 1
        if not out.ok:
            failed += out.status != 429
            per_class.setdefault(_class_of(req), []).append((False, False, math.inf))
            continue
        ttft_ms = out.ttft * 1000.0
        itl_ms = 0.0 if math.isnan(out.itl) else out.itl * 1000.0
        ttft_ok = ttft_ms <= req.slo_ttft_ms
        both = ttft_ok and itl_ms <= req.slo_tpot_ms
        per_class.setdefault(_class_of(req), []).append((both, ttft_ok, ttft_ms))
    everything = [row for rows in per_class.values() for row in rows]

    def summary(rows: list[tuple[bool, bool, float]]) -> dict[str, Any]:
        ttfts = [t * fleet.time_scale for _, _, t in rows if math.isfinite(t)]
        return {
            "requests": len(rows),
            "slo_attainment": sum(r[0] for r in rows) / len(rows) if rows else 0.0,
            "ttft_attainment": sum(r[1] for r in rows) / len(rows) if rows else 0.0,
            "ttft_p50_ms": percentile(ttfts, 0.5),
            "ttft_p90_ms": percentile(ttfts, 0.9),
            "ttft_p99_ms": percentile(ttfts, 0.99),
        }

    return {
        **summary(everything),
        "failed": failed,
        "rejected": rejected,
        "classes": {name: summary(rows) for name, rows in sorted(per_class.items())},
    }


async def _plugin_state(metrics_url: str) -> dict[str, Any]:
    """The ``predicted-latency-producer``'s ``dump_state``, if the EPP runs one."""
    if not metrics_url:
        return {}
    base = metrics_url.removesuffix("/metrics")
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(f"{base}/debug/plugins/state") as r,
    ):
        if r.status != 200:
            return {}
        states = await r.json(content_type=None)
    return next((v for k, v in states.items() if k.endswith("/predicted-latency-producer")), {})


def prediction_error(state: dict[str, Any], time_scale: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target, stats in (state.get("predictionError") or {}).items():
        if not stats.get("n"):
            continue
        out[target] = {
            "n": stats["n"],
            "mae_wall_ms": round(stats["maeMs"], 2),
            "mae_sim_ms": round(stats["maeMs"] * time_scale, 1),
            "bias_sim_ms": round(stats["biasMs"] * time_scale, 1),
            "mape": round(stats["mape"], 3),
            "p50_abs_pct_error": round(stats["p50AbsPctError"], 3),
            "p90_abs_pct_error": round(stats["p90AbsPctError"], 3),
        }
    return out


@dataclass(frozen=True)
class LatencyOptions:
    targets: tuple[str, ...] = DEFAULT_TARGETS
    rate: float = 6.0
    duration: float = 120.0
    lead_in: float = 0.25
    time_scale: float = FLEET.time_scale
    seeds: tuple[int, ...] = (1,)
    deadline: float = 600.0
    out: Path = ROOT / "docs" / "benchmarks" / "latency"


async def run_target(
    key: str, opts: LatencyOptions, fleet: FleetSpec, requests: list[SLORequest], workdir: Path
) -> dict[str, Any]:
    """One target on a cold fleet of its own: its attainment and the model's error."""
    workload = Workload(
        name="latency-slo", title="latency SLOs", description="", requests=list(requests),
        fleet=fleet, concurrency=512,
    )  # fmt: skip
    sim = SimProcess(fleet, workdir)
    await asyncio.to_thread(sim.start)
    try:
        running = await asyncio.to_thread(targets.start, key, sim, workload, workdir)
        try:
            await warm_up(running.url)
            started = time.monotonic()
            outcomes = await driver.run(
                running.url, requests, concurrency=512, time_scale=fleet.time_scale,
                deadline=opts.deadline,
            )  # fmt: skip
            seconds = time.monotonic() - started
            state = await _plugin_state(running.metrics_url)
        finally:
            await asyncio.to_thread(running.stop)
    finally:
        await asyncio.to_thread(sim.stop)
    measured = [
        (o, r)
        for o, r in zip(outcomes, requests, strict=True)
        if r.at >= opts.lead_in * opts.duration
    ]
    return {
        "target": key,
        "label": targets.label(key),
        "wall_seconds": round(seconds, 1),
        **attainment([o for o, _ in measured], [r for _, r in measured], fleet),
        "per_pod": _per_pod(o for o, _ in measured),
        "prediction_error": prediction_error(state, fleet.time_scale),
        "model": state.get("model", {}),
    }


def _per_pod(outcomes: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for out in outcomes:
        if out.ok:
            counts[out.pod] = counts.get(out.pod, 0) + 1
    return dict(sorted(counts.items()))


async def run(opts: LatencyOptions) -> dict[str, Any]:
    """Every seed's workload on every target, one after the other (targets interleaved per
    seed, so that a spell of load on the shared machine does not fall on one target only)."""
    fleet = FleetSpec(**{**FLEET.__dict__, "time_scale": opts.time_scale})
    results = []
    counts = {}
    for seed in opts.seeds:
        requests = build_requests(opts.rate, opts.duration, seed, fleet)
        counts[seed] = len(requests)
        log(f"latency: seed {seed}: {len(requests)} requests over {opts.duration:g} simulated s")
        for i, key in enumerate(opts.targets):
            name = Path(key.partition(":")[2] or key).stem
            workdir = opts.out / "work" / f"seed-{seed}" / f"{i}-{name}"
            load = os.getloadavg()[0]
            result = await run_target(key, opts, fleet, requests, workdir)
            result.update(seed=seed, load_at_start=round(load, 2))
            log(
                f"latency: seed {seed}, {key}: SLO attainment {result['slo_attainment']:.1%}, "
                f"TTFT p90 {result['ttft_p90_ms']:.0f} ms (simulated), load {load:.1f}"
            )
            results.append(result)
    return {
        "command": "epp bench latency " + " ".join(_argv(opts)),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(),
        "requests": counts,
        "measured_from_s": opts.lead_in * opts.duration,
        "fleet": fleet.as_json(),
        "classes": [c.__dict__ for c in CLASSES],
        "summary": summarize(results, opts.targets),
        "results": results,
    }


def summarize(results: list[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Per target, the median over seeds (and the range) of its attainment and model error."""
    out = []
    for key in keys:
        rows = [r for r in results if r["target"] == key]
        if not rows:
            continue
        row: dict[str, Any] = {"target": key, "label": rows[0]["label"], "runs": len(rows)}
        for metric in ("slo_attainment", "ttft_attainment", "ttft_p90_ms"):
            values = [r[metric] for r in rows]
            row[metric] = statistics.median(values)
            row[metric + "_range"] = [min(values), max(values)]
        for target in ("ttft", "tpot"):
            errors = [
                r["prediction_error"][target] for r in rows if target in r["prediction_error"]
            ]
            if errors:
                row[f"{target}_mape"] = statistics.median(e["mape"] for e in errors)
                row[f"{target}_p50_abs_pct_error"] = statistics.median(
                    e["p50_abs_pct_error"] for e in errors
                )
        out.append(row)
    return out


def _argv(opts: LatencyOptions) -> list[str]:
    argv = [f"--rate {opts.rate:g}", f"--duration {opts.duration:g}"]
    argv += [f"--time-scale {opts.time_scale:g}", "--seeds " + ",".join(map(str, opts.seeds))]
    if opts.targets != DEFAULT_TARGETS:
        argv.append("--targets " + ",".join(opts.targets))
    return argv


def _pct_range(row: dict[str, Any], metric: str) -> str:
    lo, hi = row[metric + "_range"]
    spread = f" ({lo:.1%}-{hi:.1%})" if row["runs"] > 1 else ""
    return f"{row[metric]:.1%}{spread}"


def report_md(report: dict[str, Any]) -> str:
    lines = [
        "# Latency-SLO routing: `epp bench latency`",
        "",
        f"`{report['command']}` · {report['date']} · {report['machine']}",
        "",
        f"Requests per seed: {', '.join(f'{n} (seed {s})' for s, n in report['requests'].items())}"
        f"; measured from {report['measured_from_s']:g} simulated s; times in simulated ms.",
        "",
        "Median over the seeds (range):",
        "",
        "| target | SLO attainment | TTFT attainment | TTFT p90 | TTFT error: MAPE | median "
        "| TPOT error: MAPE | median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["summary"]:
        errors = [
            f"{row[k]:.1%}" if k in row else "-"
            for k in ("ttft_mape", "ttft_p50_abs_pct_error", "tpot_mape", "tpot_p50_abs_pct_error")
        ]
        lines.append(
            f"| {row['label']} | {_pct_range(row, 'slo_attainment')} | "
            f"{_pct_range(row, 'ttft_attainment')} | {row['ttft_p90_ms']:.0f} | "
            + " | ".join(errors)
            + " |"
        )
    lines += ["", "Each run:", ""]
    lines += _runs_table(report["results"])
    lines += [
        "",
        "Prediction error of each run (chosen endpoint, against the EPP's own measurement):",
    ]
    lines += [
        "",
        "| target | seed | metric | n | MAE (sim ms) | bias (sim ms) | MAPE | p50 | p90 |",
    ]
    lines += ["|---|---|---|---|---|---|---|---|---|"]
    for r in report["results"]:
        for metric, e in r["prediction_error"].items():
            lines.append(
                f"| {r['label']} | {r['seed']} | {metric.upper()} | {e['n']} | {e['mae_sim_ms']} "
                f"| {e['bias_sim_ms']} | {e['mape']:.1%} | {e['p50_abs_pct_error']:.1%} | "
                f"{e['p90_abs_pct_error']:.1%} |"
            )
    return "\n".join(lines) + "\n"


def _runs_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| target | seed | load | SLO attainment | TTFT attainment | chat | doc | short "
        "| TTFT p50 | TTFT p90 | TTFT p99 | failed | rejected |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        classes = r["classes"]
        per_class = [f"{classes.get(c.name, {}).get('slo_attainment', 0):.1%}" for c in CLASSES]
        lines.append(
            f"| {r['label']} | {r['seed']} | {r['load_at_start']:.1f} | "
            f"{r['slo_attainment']:.1%} | {r['ttft_attainment']:.1%} | "
            + " | ".join(per_class)
            + f" | {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
            f"{r['failed']} | {r['rejected']} |"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp bench latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated")
    p.add_argument("--rate", type=float, default=6.0, help="requests per simulated second")
    p.add_argument("--duration", type=float, default=120.0, help="simulated seconds of arrivals")
    p.add_argument("--lead-in", type=float, default=0.25, help="share of the run not measured")
    p.add_argument("--time-scale", type=float, default=FLEET.time_scale, help="simulator speed")
    p.add_argument("--seeds", default="1", help="comma-separated workload seeds (default 1)")
    p.add_argument("--deadline", type=float, default=600.0, help="wall-clock cap per target (s)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "latency"))
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    keys = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    unknown = [k for k in keys if not (k.startswith("epp:") and targets.is_known(k))]
    if unknown:
        parser.error(f"targets must be epp:<existing config.yaml>: {', '.join(unknown)}")
    if args.rate <= 0 or args.duration <= 0 or not 0 <= args.lead_in < 1 or args.time_scale <= 0:
        parser.error("--rate, --duration and --time-scale must be > 0, --lead-in in [0, 1)")
    try:
        seeds = tuple(int(x) for x in args.seeds.split(",") if x.strip())
    except ValueError:
        parser.error(f"--seeds: integers separated by commas, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds: at least one seed")
    opts = LatencyOptions(
        targets=keys, rate=args.rate, duration=args.duration, lead_in=args.lead_in,
        time_scale=args.time_scale, seeds=seeds, deadline=args.deadline, out=Path(args.out),
    )  # fmt: skip
    opts.out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(run(opts))
    (opts.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    (opts.out / "report.md").write_text(report_md(report))
    print(report_md(report))
    return 0
