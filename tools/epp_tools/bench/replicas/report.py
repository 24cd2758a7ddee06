"""The Markdown report of ``epp bench replicas`` (``epp_tools.bench.replicas.cli``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def _pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def _failures(r: Mapping[str, Any]) -> list[str]:
    kinds = r.get("failures") or {}
    return [f"Failures: {', '.join(f'{k} x{n}' for k, n in kinds.items())}."] if kinds else []


def _outage(r: Mapping[str, Any]) -> list[str]:
    rec = r["recovery_s"]
    recovery = "not within the run" if math.isinf(rec) else f"{rec:.1f} s"
    lines = [
        "## Redis killed under load (2 replicas sharing through Redis)",
        "",
        f"Redis killed (SIGKILL) at {r['killed_at']:.0f} s, back (empty) at {r['back_at']:.1f} s.",
        "",
        "| requests | failed | hit before | hit during | hit after | recovery to 95% |",
        "|---|---|---|---|---|---|",
        f"| {r['requests']} | {r['failed']} | {_pct(r['hit_before'])} | {_pct(r['hit_during'])} "
        f"| {_pct(r['hit_after'])} | {recovery} |",
        "",
        "Per second (sent): "
        + ", ".join(
            f"{w['t']:.0f}s {w['requests']}r/{_pct(w['hit'])}"
            + (f"/{w['failed']}F" if w["failed"] else "")
            for w in r["windows"]
        ),
        "",
        "State-sync errors counted by each replica: "
        + ", ".join(f"{e:.0f}" for e in r["sync_errors"])
        + ".",
    ]
    lines += _failures(r)
    if r.get("exhausted"):
        lines.append("(The session supply ran out before the end of the run.)")
    return lines


def _restart(r: Mapping[str, Any]) -> list[str]:
    w = r["runs"][0].get("window_s", 10.0) if r["runs"] else 10.0
    lines = [
        "## A replica restarted under load (3 replicas)",
        "",
        f"| state | requests | failed | back SERVING after | restarted replica, first {w:g} s | "
        f"other two, same {w:g} s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        lines.append(
            f"| {'shared via Redis' if run['shared'] else 'learning alone'} | {run['requests']} | "
            f"{run['failed']} | {run['back_after_s']:.1f} s | {_pct(run['restarted_hit'])} | "
            f"{_pct(run['others_hit'])} | {_pct(run['ratio'])} |"
        )
    for run in r["runs"]:
        lines += _failures(run)
    return lines


def _workers(r: Mapping[str, Any]) -> list[str]:
    lines = [
        f"## One EPP process against `--workers 2` ({r['cpus']} CPUs)",
        "",
        "| EPP | requests | failed | req/s | EPP CPU ms/req | cores used: EPP / Envoy / sim / "
        "client / Redis |",
        "|---|---|---|---|---|---|",
    ]
    for run in r["runs"]:
        c = run["cpu_cores"]
        cores = " / ".join(
            f"{c.get(k, 0.0):.2f}" for k in ("epp", "envoy", "sim", "client", "redis")
        )
        name = "1 process" if run["workers"] == 1 else f"--workers {run['workers']}"
        lines.append(
            f"| {name} | "
            f"{run['requests']} | {run['failed']} | {run['req_per_s']:.0f} | "
            f"{run['epp_cpu_ms_per_req']:.2f} | {cores} |"
        )
    one, two = r["runs"][0]["req_per_s"], r["runs"][-1]["req_per_s"]
    if one:
        lines += ["", f"Throughput ratio (--workers 2 / one process): {two / one:.2f}."]
    return lines


def render(report: Mapping[str, Any]) -> str:
    lines = ["# epp bench replicas", "", f"{report['started']}, {report['cpus']} CPUs.", ""]
    for name, part in (("outage", _outage), ("restart", _restart), ("workers", _workers)):
        if name in report:
            lines += [*part(report[name]), ""]
    return "\n".join(lines)
