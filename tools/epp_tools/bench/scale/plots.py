"""PNG plots of ``epp bench scale`` (matplotlib, headless; none without it).

* ``<name>.png``: the ramp, one panel each for requests and output tokens per simulated minute,
  the router's and Envoy's cores, the router's RSS, the per-pick p50/p99, preemptions and the
  share of the oracle's reuse, against live agents, one line per target;
* ``growth.png`` (``growth_plot``): CPU per request against pods, live sessions and context
  length, and RSS against live sessions.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _pyplot() -> Any:
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _router(row: Row) -> str:
    return (
        "epp"
        if "epp" in row["cores"]
        else next((n for n in row["cores"] if n not in ("sim", "client", "envoy")), "envoy")
    )


def _ms(text: object) -> float:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _pick_p50(r: Row) -> float:
    return _ms((r.get("pick") or {}).get("p50_ms"))


_PANELS: tuple[tuple[str, Callable[[Row], float], bool], ...] = (
    ("requests / simulated min", lambda r: r["requests_per_min"], False),
    ("output tokens / sim. min (real tokens)", lambda r: r["output_tokens_per_min_real"], False),
    ("router cores (Envoy dashed)", lambda r: r["cores"].get(_router(r), 0.0), False),
    ("router RSS (MB)", lambda r: r["rss_mb_peak"].get(_router(r), 0.0), False),
    ("per-pick p50 / p99 (ms, dashed p99)", _pick_p50, True),
    ("preemptions per step", lambda r: r["preemptions"], False),
    ("% of the oracle's reuse", lambda r: 100 * (r["oracle_share"] or 0.0), False),
)


def ramp_plots(report: Mapping[str, Any], out: Path, name: str = "ramp") -> list[Path]:
    if not available():
        return []
    plt = _pyplot()
    ran = [t for t in report["targets"] if t["steps"]]
    if not ran:
        return []
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    flat = [ax for row in axes for ax in row]
    for ax, (title, value, with_p99) in zip(flat, _PANELS, strict=False):
        for t in ran:
            xs = [r["agents"] for r in t["steps"]]
            (line,) = ax.plot(xs, [value(r) for r in t["steps"]], marker="o", label=t["target"])
            if with_p99:
                p99 = [_ms((r.get("pick") or {}).get("p99_ms")) for r in t["steps"]]
                ax.plot(xs, p99, linestyle="--", color=line.get_color())
            if title.startswith("router cores"):
                envoy = [r["cores"].get("envoy", math.nan) for r in t["steps"]]
                ax.plot(xs, envoy, linestyle="--", color=line.get_color())
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("concurrent agents")
        ax.grid(alpha=0.3)
    flat[0].legend(fontsize=8)
    flat[-1].set_visible(False)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def growth_plot(curves: Sequence[Mapping[str, Any]], out: Path, name: str = "growth") -> list[Path]:
    """One panel per curve: ``{"title", "x_label", "points": [(x, y), ...], "y_label"}``."""
    if not available() or not curves:
        return []
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.8), squeeze=False)
    for ax, curve in zip(axes[0], curves, strict=True):
        xs = [p[0] for p in curve["points"]]
        ax.plot(xs, [p[1] for p in curve["points"]], marker="o")
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_title(curve["title"], fontsize=10)
        ax.set_xlabel(curve["x_label"])
        ax.set_ylabel(curve["y_label"])
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / f"{name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
