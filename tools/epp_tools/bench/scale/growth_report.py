"""The report of ``epp bench scale growth``: tables, the ratios the targets are about, the plot."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from epp_tools.bench.scale.plots import growth_plot

Point = Any
"""A ``epp_tools.bench.scale.growth.Point`` (not imported: that module imports this one)."""

TARGETS = {"pods": 1.5, "sessions": 1.2}
"""Largest point over smallest, CPU per request: the issue's targets."""
AXES = {
    "pods": ("pods", "CPU per request against pods", "pods"),
    "sessions": ("sessions", "CPU per request against live sessions", "live sessions"),
    "context": ("context", "CPU per request against context", "context tokens"),
}


def ratio(points: Sequence[Point]) -> float:
    return points[-1].cpu_us_median / points[0].cpu_us_median if points else 0.0


def _table(name: str, points: Sequence[Point]) -> str:
    attr, title, label = AXES[name]
    rows = [f"{title}:\n\n| {label} | CPU µs/request, median (mean) | x first | process RSS MB "
            f"| RSS MB added by the sessions | failed |\n|---|---|---|---|---|---|\n"]  # fmt: skip
    base = points[0].cpu_us_median if points else 1.0
    for p in points:
        added = f"{p.rss_mb_sessions:,.1f}" if name == "sessions" else "-"
        rows.append(
            f"| {getattr(p, attr):,} | {p.cpu_us_median:,.0f} ({p.cpu_us_mean:,.0f}) | "
            f"{p.cpu_us_median / base:.2f} | {p.rss_mb:,.0f} | {added} | {p.failed} |\n"
        )
    return "".join(rows) + "\n"


def verdicts(result: Mapping[str, Sequence[Point]]) -> list[str]:
    out = []
    for name, limit in TARGETS.items():
        points = result.get(name) or []
        if len(points) < 2:
            continue
        r = ratio(points)
        x0, x1 = getattr(points[0], name), getattr(points[-1], name)
        met = "met" if r <= limit else "NOT met"
        out.append(f"CPU per request at {x1:,} {name} against {x0:,}: {r:.2f}x "
                   f"(target <= {limit:g}x: {met})")  # fmt: skip
    sessions = result.get("sessions") or []
    if len(sessions) >= 2:
        a, b = sessions[0], sessions[-1]
        per = (b.rss_mb_sessions - a.rss_mb_sessions) * 2**20 / max(b.sessions - a.sessions, 1)
        out.append(f"memory per live session ({b.context:,}-token contexts): {per / 1024:,.1f} KB")
    return out


def growth_md(result: Mapping[str, Sequence[Point]], command: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = (
        f"# epp bench scale growth\n\n`{command}` ({when}"
        "; in process, each curve in a fresh process, its points interleaved: the real ext_proc "
        "server and request path, synthetic pods and sessions, see "
        "`tools/epp_tools/bench/scale/growth.py`)"
        "\n\n"
    )
    parts = [head] + [_table(n, pts) for n, pts in result.items() if pts]
    parts.append("".join(f"- {v}\n" for v in verdicts(result)))
    return "".join(parts)


def _curves(result: Mapping[str, Sequence[Point]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, points in result.items():
        attr, title, label = AXES[name]
        pts = [(getattr(p, attr), p.cpu_us_median) for p in points]
        out.append({"title": title, "x_label": label, "y_label": "µs CPU", "points": pts})
    sessions = result.get("sessions") or []
    if sessions:
        pts = [(p.sessions, p.rss_mb_sessions) for p in sessions]
        out.append({"title": "RSS added by live sessions", "x_label": "live sessions",
                    "y_label": "MB", "points": pts})  # fmt: skip
    return out


def write(
    result: Mapping[str, Sequence[Point]], out: Path, command: str, quick: bool = False
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    name = "growth-quick" if quick else "growth"
    paths = [out / f"{name}.json", out / f"{name}.md"]
    data = {"command": command, "curves": {k: [asdict(p) for p in v] for k, v in result.items()},
            "verdicts": verdicts(result)}  # fmt: skip
    paths[0].write_text(json.dumps(data, indent=2) + "\n")
    paths[1].write_text(growth_md(result, command))
    return paths + growth_plot(_curves(result), out, name)
