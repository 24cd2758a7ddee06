"""Markdown of ``epp bench scale`` results: the ramp table per target, its setup in words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_RAMP_HEADER = (
    "| agents | sessions | req/min | out tok/min (real) | errors | shed | preemptions | % of "
    "oracle | KV / working set | router cores | router CPU ms/req (net of idle) | router RSS MB "
    "| pick p50 / p99 ms | Envoy cores | turn p50 / p99 s | wall req/s | load |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _main_process(row: Mapping[str, Any], target: str) -> str:
    """The router process of a target: ``epp`` (with Envoy beside), else the peer or Envoy."""
    cores = row["cores"]
    if "epp" in cores:
        return "epp"
    return next((n for n in cores if n not in ("sim", "client", "envoy")), "envoy")


def ramp_line(row: Mapping[str, Any], target: str) -> str:
    proc = _main_process(row, target)
    pick = row.get("pick") or {}
    envoy = row["cores"].get("envoy")
    return (
        f"| {row['agents']:,} | {row['sessions_mean']:,.0f} | {row['requests_per_min']:,.0f} | "
        f"{row['output_tokens_per_min']:,.0f} ({row['output_tokens_per_min_real']:,.0f}) | "
        f"{row['errors']} | {row['shed']} | {row['preemptions']} | {_pct(row['oracle_share'])} | "
        f"{row['fleet_kv_over_working_set'] or '-'} | {row['cores'].get(proc, 0):.2f} ({proc}) | "
        f"{row['cpu_ms_per_req'].get(proc, 0):.2f} "
        f"({row.get('cpu_ms_per_req_net', {}).get(proc, 0):.2f}) | "
        f"{row['rss_mb_peak'].get(proc, 0):,.0f} | "
        f"{pick.get('p50_ms', '-')} / {pick.get('p99_ms', '-')} | "
        f"{'-' if envoy is None or proc == 'envoy' else f'{envoy:.2f}'} | "
        f"{row['turn_s_p50']:.1f} / {row['turn_s_p99']:.1f} | {row['wall_requests_per_s']:.1f} | "
        f"{row['load_average_1m']:.1f} |\n"
    )


def setup_text(run: Mapping[str, Any]) -> str:
    sc, fleet, shape = run["scaling"], run["fleet"], run["shape"]
    f = sc["length_factor"]
    return (
        f"{run['started']}. Lengths divided by {f} (a simulated token stands for {f} real ones; "
        f"median main-agent prompt {shape['context_median'] // f:,}+ tokens for "
        f"{shape['context_median']:,}+ real, output median {round(shape['output_median'] / f)} "
        f"for {shape['output_median']}); decode steps {f} times as long and prefill {f} times "
        f"fewer tokens per second, so turns last as long as real ones; simulated time runs at "
        f"{sc['time_scale']:g}x the wall clock (the wall-clock request rate is {sc['time_scale']:g}"
        f" x the simulated one; rates below are per simulated minute). Fleet: {fleet['pods']} "
        f"pods x {fleet['kv_tokens_per_pod']:,} KV tokens ({run['fleet_kv_tokens']:,} in all, "
        f"{run['kv_factor']:g} x the estimated working set of "
        f"{run['working_set_estimate_tokens']:,} at {max(run['steps']):,} agents), one "
        f"`epp sim` process. Each step: new agents join "
        f"over {run['join_s']:g} s (their first, whole-context turn unmeasured), "
        f"{run['settle_s']:g} s settle, {run['window_s']:g} simulated seconds measured.\n\n"
    )


def ramp_md(report: Mapping[str, Any]) -> str:
    run = report["run"]
    parts = [f"# epp bench scale\n\n`{run.get('command', 'epp bench scale')}`\n\n", setup_text(run)]
    for target in report["targets"]:
        parts.append(f"## {target['label']}\n\n")
        if target["status"] != "ok":
            parts.append(f"{target['status']}: {target.get('reason', '')}\n\n")
        if target["steps"]:
            parts.append(_RAMP_HEADER)
            parts += [ramp_line(r, target["target"]) for r in target["steps"]]
            parts.append("\n")
            parts.append(_shape_line(target["steps"][-1]))
        hold = target.get("hold") or {}
        if hold:
            parts.append(_hold_line(hold))
    return "".join(parts)


def _shape_line(row: Mapping[str, Any]) -> str:
    shape = row.get("shape") or {}
    if not shape:
        return ""
    return (
        f"Traffic of the last step (turns after each agent's first): median prompt "
        f"{shape['median_prompt_tokens']:,.0f} tokens, median output "
        f"{shape['median_output_tokens']:,.0f} (prompt:output {shape['prompt_to_output']}), "
        f"{shape['share_turns_reuse_ge_90']:.1%} of turns could reuse at least 90% of their "
        f"input.\n\n"
    )


def _hold_line(hold: Mapping[str, Any]) -> str:
    samples = hold.get("rss_samples") or []
    if not samples:
        return ""
    first, last = samples[0][1], samples[-1][1]
    parts = [f"{name} {_change(first, last, name, MB)}" for name in first]
    return (
        f"Hold of {hold['minutes']:g} minutes at the last step: RSS {', '.join(parts)}; "
        f"{hold['errors']} errors.{_state_line(hold)}{_last_window(hold)}\n\n{_traced(hold)}"
    )


STEADY_WINDOW_S = 30 * 60
"""The hold's last this many seconds are reported apart when it is longer: the EPP's bounded
state (prefix index, Responses bindings) takes most of an hour to fill at 3,000 agents, so a
flat RSS can only show in a window that starts after that."""


def _tail(samples: list[Any], window_s: float) -> list[Any]:
    """The samples of the last ``window_s`` seconds (``[at, values]`` pairs, ``at`` ascending)."""
    start = samples[-1][0] - window_s
    return [s for s in samples if s[0] >= start]


def _last_window(hold: Mapping[str, Any]) -> str:
    """RSS (first -> last, and its range) and the bounded state over the hold's last
    ``STEADY_WINDOW_S``; empty when the hold is not longer than that."""
    samples = hold.get("rss_samples") or []
    if not samples or samples[-1][0] - samples[0][0] <= STEADY_WINDOW_S:
        return ""
    tail = _tail(samples, STEADY_WINDOW_S)
    parts = []
    for name in tail[0][1]:
        values = [s[1][name] / MB[0] for s in tail if name in s[1]]
        change = _change(tail[0][1], tail[-1][1], name, MB)
        parts.append(f"{name} {change} (range {min(values):,.0f}-{max(values):,.0f} MB)")
    state = hold.get("state_samples") or []
    state_tail = _state_line({"state_samples": _tail(state, STEADY_WINDOW_S)}) if state else ""
    return (
        f" Its last {STEADY_WINDOW_S // 60} minutes: RSS {', '.join(parts)}."
        f"{state_tail.replace(' Over the same time', ' Over those minutes')}"
    )


def _traced(hold: Mapping[str, Any]) -> str:
    """The EPP's allocation sites that grew the most over the hold (``--tracemalloc``)."""
    traced = hold.get("tracemalloc") or {}
    top = traced.get("top") or []
    if not top:
        return ""
    lines = [
        f"Traced Python allocations over the hold: {traced.get('sizeDiffBytes', 0) / 2**20:+,.1f} "
        "MB in all; the sites that grew the most:\n",
        "| site | MB now | change MB | blocks change |",
        "|---|---|---|---|",
    ]
    for site in top:
        now, change, blocks = site["bytes"] / 2**20, site["bytesDiff"] / 2**20, site["blocksDiff"]
        lines.append(f"| `{site['site']}` | {now:,.1f} | {change:+,.1f} | {blocks:+,} |")
    return "\n".join(lines) + "\n\n"


MB = (2**20, " MB")
STATE_LABELS: dict[str, tuple[str, tuple[float, str]]] = {
    "prefix_entries": ("prefix index entries", (1, "")),
    "response_bindings": ("Responses bindings", (1, "")),
    "working_set_tokens": ("the agents' contexts (simulated tokens)", (1, "")),
    "pymalloc_bytes": ("Python objects (pymalloc)", MB),
    "heap_in_use_bytes": ("C heap in use", MB),
    "heap_free_bytes": ("C heap free but held", MB),
}


def _change(
    first: Mapping[str, float], last: Mapping[str, float], key: str, unit: tuple[float, str]
) -> str:
    """``first -> last`` of one sampled value, in ``unit`` (divisor, suffix)."""
    scale, suffix = unit
    return f"{first[key] / scale:,.0f} -> {last.get(key, 0) / scale:,.0f}{suffix}"


def _state_line(hold: Mapping[str, Any]) -> str:
    """What the EPP's bounded state did over the hold (its RSS growth is mostly that)."""
    samples = hold.get("state_samples") or []
    if not samples:
        return ""
    first, last = samples[0][1], samples[-1][1]
    parts = [
        f"{label} {_change(first, last, key, unit)}"
        for key, (label, unit) in STATE_LABELS.items()
        if key in first
    ]
    return f" Over the same time: {', '.join(parts)}." if parts else ""
