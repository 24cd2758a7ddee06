"""One step of ``epp bench rate`` as a row of numbers, and the sweep as a Markdown table.

``step_row`` takes the shots of a step and two ``Reading``s (``/metrics`` text, CPU seconds per
process, a clock) taken around it, and derives what ``epp_tools.bench.rate.cli`` documents: the
per-pick and EPP-processing percentiles from the histogram differences
(``epp_tools.bench.rate.stats``), the client-side latency (nearest rank), the achieved rate
(requests answered 200 per second of the step's arrival window: an open-loop client sends on
schedule, so a target that falls behind shows as errors, latency and, when the client itself is
starved, send lag), CPU per answered request and in cores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp_tools.bench.rate.load import Shot
from epp_tools.bench.rate.stats import Histogram, format_ms, parse_histogram
from epp_tools.bench.workloads.text import percentile

PICK = "llm_d_epp_scheduler_e2e_duration_seconds"
PROCESSING = "llm_d_epp_request_processing_duration_seconds"
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
REACHED_SHARE = 0.95
MAX_LAG_P99 = 0.05


@dataclass(frozen=True)
class Reading:
    metrics: str
    cpu: Mapping[str, float]
    at: float
    epp_wait: float = 0.0
    """Seconds the EPP's threads had waited for a CPU while runnable (``schedstat``)."""


def _quantiles(h: Histogram) -> dict[str, str]:
    return {k: format_ms(h.quantile(q), h.top) for k, q in QUANTILES.items()}


def _delta(before: Reading, after: Reading, name: str) -> Histogram:
    return parse_histogram(after.metrics, name).minus(parse_histogram(before.metrics, name))


def step_row(
    server: str,
    rate: float,
    duration: float,
    shots: Sequence[Shot],
    wall: float,
    before: Reading,
    after: Reading,
    idle_cores: float,
) -> dict[str, Any]:
    ok = [s for s in shots if s.ok]
    errors: dict[str, int] = {}
    for s in shots:
        if not s.ok:
            key = s.error[:60] or f"HTTP {s.status}"
            errors[key] = errors.get(key, 0) + 1
    pick, processing = _delta(before, after, PICK), _delta(before, after, PROCESSING)
    span = max(after.at - before.at, 1e-9)
    cpu = {n: after.cpu[n] - before.cpu.get(n, 0.0) for n in after.cpu}
    n_ok = max(len(ok), 1)
    achieved = len(ok) / duration
    lag_p99 = percentile([s.lag for s in shots], 0.99)
    latencies = [s.latency for s in ok]
    return {
        "server": server,
        "target_rate": rate,
        "duration_s": duration,
        "sent": len(shots),
        "ok": len(ok),
        "errors": len(shots) - len(ok),
        "error_kinds": errors,
        "achieved_rate": round(achieved, 1),
        "wall_s": round(wall, 3),
        "reached": not errors and achieved >= REACHED_SHARE * rate and lag_p99 < MAX_LAG_P99,
        "lag_p99_ms": round(lag_p99 * 1000, 2),
        "picks": int(pick.count),
        "pick_ms": {**_quantiles(pick), "mean": format_ms(pick.mean)},
        "processing_ms": _quantiles(processing),
        "latency_ms": {k: round(percentile(latencies, q) * 1000, 2) for k, q in QUANTILES.items()},
        "cpu_s": {n: round(v, 3) for n, v in cpu.items()},
        "cores": {n: round(v / span, 3) for n, v in cpu.items()},
        "cpu_ms_per_req": {n: round(v * 1000 / n_ok, 3) for n, v in cpu.items()},
        "epp_net_ms_per_req": round(max(0.0, cpu["epp"] - idle_cores * span) * 1000 / n_ok, 3),
        "epp_idle_cores": round(idle_cores, 4),
        "epp_cpu_wait_s_per_s": round((after.epp_wait - before.epp_wait) / span, 3),
    }


_HEADER = (
    "| server | target/s | achieved/s | errors | per pick p50 / p95 / p99 (ms) | EPP processing "
    "p50 / p95 / p99 (ms) | latency p50 / p95 (ms) | EPP CPU ms/req (net of idle) | EPP cores "
    "| Envoy / sim / client cores | client lag p99 (ms) | EPP CPU wait (s/s) | load |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def _cores(cores: Mapping[str, float], name: str) -> str:
    return f"{cores[name]:.2f}" if name in cores else "-"


def _line(r: Mapping[str, Any]) -> str:
    pick, proc, lat, cores = r["pick_ms"], r["processing_ms"], r["latency_ms"], r["cores"]
    reached = "" if r["reached"] else " (not reached)"
    return (
        f"| {r['server']} | {r['target_rate']:g} | {r['achieved_rate']:.0f}{reached} | "
        f"{r['errors']} | {pick['p50']} / {pick['p95']} / {pick['p99']} | {proc['p50']} / "
        f"{proc['p95']} / {proc['p99']} | {lat['p50']:.1f} / {lat['p95']:.1f} | "
        f"{r['cpu_ms_per_req']['epp']:.2f} ({r['epp_net_ms_per_req']:.2f}) | "
        f"{cores['epp']:.2f} | {_cores(cores, 'envoy')} / {_cores(cores, 'sim')} / "
        f"{_cores(cores, 'client')} | {r['lag_p99_ms']:.1f} | "
        f"{r['epp_cpu_wait_s_per_s']:.2f} | {r.get('load_average_1m', '-')} |\n"
    )


def report_md(report: Mapping[str, Any]) -> str:
    run = report["run"]
    head = (
        f"# epp bench rate\n\n{run['started']}: {run['pods']} pods, config `{run['config']}`, "
        f"{run['arrivals']} arrivals, {run['duration_s']:g} s per rate, EPP on CPU "
        f"{run['epp_cpu']}, the rest on {run['other_cpus']}, {run['max_tokens']} output tokens "
        f"{'streamed' if run['stream'] else 'in one answer'}, load average "
        f"{', '.join(f'{x:.1f}' for x in run['load_average'])}\n\n"
    )
    lines = [head, _HEADER]
    for server in report["servers"]:
        if server["status"] != "ok":
            lines.append(f"| {server['server']} | failed: {server.get('reason', '')} |\n")
        lines += [_line(r) for r in server["steps"]]
    return "".join(lines)
