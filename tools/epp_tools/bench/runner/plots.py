"""PNG plots of a benchmark report (matplotlib, headless): one figure per kind, one panel per
workload.

* ``ttft_cdf.png``: the cumulative distribution of TTFT per target (log x axis);
* ``hit_ratio.png``: prefix-cache hit ratio per target, with the oracle's achievable reuse;
* ``per_pod_load.png``: requests per pod for each target.

matplotlib is an optional dependency (the ``stack`` extra the README's first command installs, or
``bench``); without it no plot is drawn and the runner says so.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _pyplot() -> Any:
    # imported by name: matplotlib is optional, and the type checker must not require it
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def _panels(count: int) -> tuple[Any, list[Any]]:
    plt = _pyplot()
    cols = min(2, count)
    rows = -(-count // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _ran(w: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in w["results"] if r["status"] == "ok" and r["ok"]]


def _save(fig: Any, path: Path) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_cdf(workloads: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, axes = _panels(len(workloads))
    for ax, w in zip(axes, workloads, strict=True):
        for r in _ran(w):
            xs = r["ttft_ms"]
            if xs:
                ys = [(i + 1) / len(xs) for i in range(len(xs))]
                ax.step(xs, ys, where="post", label=r["target"])
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms, wall clock)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"({w['name']}) {w['title']}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def hit_ratio(workloads: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, axes = _panels(len(workloads))
    for ax, w in zip(axes, workloads, strict=True):
        ran = _ran(w)
        names = [r["target"] for r in ran]
        ax.bar(names, [r["hit_ratio"] * 100 for r in ran], color="tab:blue")
        oracle = w["oracle"]["achievable_reuse"] * 100
        ax.axhline(oracle, color="tab:red", linestyle="--", label=f"oracle {oracle:.1f}%")
        ax.set_ylim(0, 100)
        ax.set_ylabel("prefix-cache hit ratio (%)")
        ax.set_title(f"({w['name']}) {w['title']}", fontsize=10)
        ax.legend(fontsize=8)
    return _save(fig, path)


def per_pod_load(workloads: Sequence[Mapping[str, Any]], path: Path) -> Path:
    fig, axes = _panels(len(workloads))
    for ax, w in zip(axes, workloads, strict=True):
        ran = _ran(w)
        pods = sorted({p for r in ran for p in r["per_pod"]})
        width = 0.8 / max(1, len(pods))
        for j, pod in enumerate(pods):
            xs = [i + j * width for i in range(len(ran))]
            ax.bar(xs, [r["per_pod"].get(pod, 0) for r in ran], width, label=pod)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(ran))])
        ax.set_xticklabels([r["target"] for r in ran])
        ax.set_ylabel("requests served")
        ax.set_title(f"({w['name']}) {w['title']}", fontsize=10)
        ax.legend(fontsize=8)
    return _save(fig, path)


def draw_all(report: Mapping[str, Any], out: Path) -> list[Path]:
    workloads = [w for w in report["workloads"] if _ran(w)]
    if not workloads:
        return []
    if importlib.util.find_spec("matplotlib") is None:
        print("bench: matplotlib is not installed: no plots (pip install matplotlib)")
        return []
    return [
        ttft_cdf(workloads, out / "ttft_cdf.png"),
        hit_ratio(workloads, out / "hit_ratio.png"),
        per_pod_load(workloads, out / "per_pod_load.png"),
    ]
