"""Samples, verdict and table of ``epp bench soak`` (see ``epp_tools.bench.soak.cli``)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from epp_tools.stack.procs import direct_opener
from epp_tools.stack.replicas import EppSet

MAPS: dict[str, tuple[str, str]] = {
    "prefix index": ("approx-prefix-cache-producer", "entries"),
    "response ids": ("response-affinity-filter", "bindings"),
    "sessions": ("session-affinity-scorer", "bindings"),
    "in-flight": ("inflight-load-producer", "open"),
    "programs": ("program-aware-fairness", "programs"),
}
"""Map name → (plugin type, key of its ``dump_state``; a mapping counts its entries)."""
RSS_LIMIT = 0.05


@dataclass
class Sample:
    t: float
    rss_mb: float = 0.0
    fds: int = 0
    tasks: int = 0
    threads: int = 0
    queued: float = 0.0
    maps: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _get(epp: EppSet, path: str) -> bytes:
    url = f"http://127.0.0.1:{epp.ports[0].metrics}{path}"
    with direct_opener().open(url, timeout=60) as r:  # a debugging EPP may be slow
        return bytes(r.read())


def sample(epp: EppSet, t: float) -> Sample:
    runtime = json.loads(_get(epp, "/debug/runtime"))
    state: dict[str, Any] = json.loads(_get(epp, "/debug/plugins/state"))
    out = Sample(
        t=t,
        rss_mb=runtime["rssBytes"] / 1e6,
        fds=runtime["openFds"],
        tasks=runtime["asyncioTasks"],
        threads=runtime["threads"],
    )
    for name, (plugin_type, key) in MAPS.items():
        for typed, dump in state.items():
            if typed.endswith("/" + plugin_type) and key in dump:
                value = dump[key]
                out.maps[name] = len(value) if isinstance(value, dict | list) else int(value)
    for line in _get(epp, "/metrics").decode().splitlines():
        if line.startswith("llm_d_epp_flow_control_queue_size{"):
            out.queued += float(line.rsplit(" ", 1)[1])
    return out


def verdict(samples: Sequence[Sample]) -> dict[str, Any]:
    """RSS growth after the warm-up (the first fifth): median of the last three samples against
    the median of the first three after the warm-up; descriptor and task ranges after it."""
    warm = samples[len(samples) // 5 :] or list(samples)
    head = statistics.median(s.rss_mb for s in warm[:3])
    tail = statistics.median(s.rss_mb for s in warm[-3:])
    growth = (tail - head) / head if head else 0.0
    fds = [s.fds for s in warm]
    tasks = [s.tasks for s in warm]
    return {
        "rss_after_warmup_mb": round(head, 1),
        "rss_end_mb": round(tail, 1),
        "rss_growth": round(growth, 4),
        "fds_range": [min(fds), max(fds)],
        "tasks_range": [min(tasks), max(tasks)],
        "flat": growth < RSS_LIMIT,
    }


def render(result: dict[str, Any]) -> str:
    samples = [Sample(**s) for s in result["samples"]]
    v = result["verdict"]
    names = list(MAPS)
    lines = [
        f"{result['minutes']:g} minutes, {result['agents']} agentic + {result['streams']} "
        f"streaming clients: {result['requests']:,} requests, {result['failed']:,} failed.",
        "",
        "| min | RSS MB | fds | asyncio tasks | threads | queued | " + " | ".join(names) + " |",
        "|---" * (6 + len(names)) + "|",
    ]
    step = max(1, len(samples) // 12)
    shown = list(samples[::step])
    if shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    for s in shown:
        maps = " | ".join(f"{s.maps.get(n, 0):,}" if n in s.maps else "-" for n in names)
        lines.append(
            f"| {s.t / 60:.1f} | {s.rss_mb:.1f} | {s.fds} | {s.tasks} | {s.threads} "
            f"| {s.queued:g} | {maps} |"
        )
    lines += [
        "",
        f"RSS after warm-up {v['rss_after_warmup_mb']} MB, at the end {v['rss_end_mb']} MB: "
        f"growth {v['rss_growth'] * 100:+.1f}% ({'flat' if v['flat'] else 'NOT flat'}, limit "
        f"{RSS_LIMIT * 100:.0f}%); descriptors {v['fds_range'][0]}-{v['fds_range'][1]}, asyncio "
        f"tasks {v['tasks_range'][0]}-{v['tasks_range'][1]} after warm-up.",
    ]
    return "\n".join(lines) + "\n"
