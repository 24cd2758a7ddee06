"""The report of ``epp bench scale cores``: the measured costs and the computed line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _group(g: Mapping[str, Any]) -> str:
    if g["status"] != "ok":
        return f"`--workers {g['workers']}`: {g['status']}: {g.get('reason', '')}\n\n"
    rows = [
        f"`--workers {g['workers']}` (idle {g['idle_cores'] * 100:.1f}% of a core, subtracted):\n\n"
        "| rate/s | achieved/s | errors | CPU µs/request | CPU µs/chunk | EPP cores |\n"
        "|---|---|---|---|---|---|\n"
    ]
    for s in g["steps"]:
        mark = "" if s["reached"] else " (not reached)"
        rows.append(
            f"| {s['rate']:g} | {s['achieved']:g}{mark} | {s['errors']} | "
            f"{s['us_per_request']:,.0f} | {s['us_per_chunk']:.1f} | {s['cores']:.2f} |\n"
        )
    rows.append(_long(g["big"], f"\n{g['big']['tokens']:,}-token prompts", g["idle_cores"]))
    turns = g.get("turns")
    if turns:
        what = (f"{turns['tokens']:,}-token agent turns (all but the last "
                f"{turns['tail_tokens']:,} tokens shared, the index holding them)")  # fmt: skip
        rows.append("\n" + _long(turns, what, g["idle_cores"]))
    rows.append("\n")
    return "".join(rows)


def _long(row: Mapping[str, Any], what: str, idle: float) -> str:
    """One long-prompt measurement: the slope and the runs it came from."""
    at = row.get("us_per_request_at") or {}
    each = ", ".join(f"{v:,.0f} µs at {k}/s" for k, v in at.items())
    idle_before = f"; idle {row['idle_cores'] * 100:.1f}% of a core just before" if (
        "idle_cores" in row) else ""  # fmt: skip
    workers = row.get("us_per_request_by_worker")
    by_worker = (
        " Each worker's own slope, the busiest first: "
        + ", ".join(f"{v:,.0f} µs" for v in workers)
        + " (the least busy one mostly receives and applies the other's facts)"
        + (f"; applying them took {row['us_applied_per_request']:,.0f} µs per request as the "
           "EPP timed it (`llm_d_epp_state_sync_apply_seconds_total`"
           + "".join(f", {k} {v:,.0f} µs" for k, v in row.get("us_applied_by_plugin", {}).items())
           + ")"
           if "us_applied_per_request" in row else "")
        + _slope(row)
        + ".\n"
    ) if workers else ""  # fmt: skip
    return (
        f"{what}: {row['us_per_request']:,.0f} µs CPU per request, the "
        f"slope between {row.get('low_rate', row['rate']):g}/s and {row['rate']:g}/s"
        f"{f' (CPU per answered request, net of idle: {each})' if each else ''}; "
        f"{row['answered']} answered, {row['errors']} errors{idle_before}.\n{by_worker}"
    )


def _slope(row: Mapping[str, Any]) -> str:
    """What of the applying grows with the requests (the rest is paid per second)."""
    if "us_applied_slope" not in row:
        return ""
    by = row.get("us_applied_slope_by_plugin", {})
    return (f", of which {row['us_applied_slope']:,.0f} µs grows with the requests (the slope "
            "between the two rates" + "".join(f", {k} {v:,.0f} µs" for k, v in by.items())
            + "; the rest is paid per second whatever the rate: periodic refreshes and sync "
            "rounds)")  # fmt: skip


def _workers(n: int) -> str:
    return "1 worker or replica" if n == 1 else f"{n} workers or replicas"


def _line(g: Mapping[str, Any], seed: Mapping[str, float]) -> str:
    c = g.get("computed") or {}
    if not c:
        return ""
    rps, cps = seed["requests_per_s"], seed["chunks_per_s"]
    return (
        f"- `--workers {g['workers']}`: {rps:,.1f} requests/s x "
        f"{c['us_per_request_195k']:,.0f} µs + {cps:,.0f} chunks/s x "
        f"{c['us_per_chunk']:.1f} µs (measured at {c['at_rate']:g}/s) = **{c['cores']:.2f} cores** "
        f"({c['cores_requests']:.2f} for requests, {c['cores_chunks']:.2f} for chunks): "
        f"{_workers(c['workers_needed'])} at one core each; llm-d's Go EPP: "
        f"{cps:,.0f} x {seed['go_us_per_chunk']:g} µs = **{c['go_cores_chunks_only']:.2f} "
        f"cores** for the chunks alone"
        + (f"; with agents' turns instead of fresh prompts ({c['us_per_request_turn']:,.0f} µs "
           f"each), **{c['cores_turns']:.2f} cores**" if "cores_turns" in c else "")
        + "\n"
    )  # fmt: skip


def _scaling(report: Mapping[str, Any]) -> str:
    """N workers' cores at the peak, computed from the 1- and 2-worker costs."""
    sc = report.get("scaling") or {}
    if not sc:
        return ""
    go = report["seed"]["chunks_per_s"] * report["seed"]["go_us_per_chunk"] / 1e6
    rows = [
        f"\nWith N workers (computed: {_added(sc, '')} to each 195,000-token request, the "
        "other's prefix-index facts applied, paid once per other worker; a chunk's cost does not "
        "depend on N):\n\n"
        "| workers | µs per 195,000-token request | cores at the peak | vs the Go EPP's chunks "
        "alone |\n|---|---|---|---|\n"
    ]
    for r in sc["rows"]:
        rows.append(
            f"| {r['workers']} | {r['us_per_request_195k']:,.0f} | {r['cores']:.2f} | "
            f"{r['cores'] / go:.2f}x |\n"
        )
    if "us_added_per_worker_turn" in sc:
        rows.append(
            f"\nThe same from agents' turns ({_added(sc, '_turn')} to each turn: the other's "
            "facts are blocks the index mostly holds):\n\n"
            "| workers | µs per agent turn | cores at the peak | vs 1 worker |\n|---|---|---|---|\n"
        )
        base = sc["rows"][0]["cores_turns"]
        for r in sc["rows"]:
            rows.append(
                f"| {r['workers']} | {r['us_per_request_turn']:,.0f} | {r['cores_turns']:.2f} | "
                f"{r['cores_turns'] / base:.2f}x |\n"
            )
    return "".join(rows)


def _added(sc: Mapping[str, Any], suffix: str) -> str:
    """What the table adds per other worker, and where that figure comes from."""
    total = f"{sc[f'us_added_per_worker{suffix}']:,.0f} µs"
    applied = sc.get(f"us_applied_per_worker{suffix}")
    if applied is None:
        return f"a second worker added {total}"
    return (f"applying the other worker's facts cost each worker {applied:,.0f} µs per "
            "request (what grows with the requests; receiving and decoding them not included); the "
            "2-worker total exceeded "
            f"the 1-worker one by {total}")  # fmt: skip


def cores_md(report: Mapping[str, Any]) -> str:
    parts = [
        f"# epp bench scale cores\n\n`{report.get('command', '')}` ({report['started']})\n\n",
        *(_group(g) for g in report["groups"]),
        "At llm-d 1.0's published peak (7,612 requests/min, 6.6M output tokens/min, one token "
        "per chunk):\n\n",
        *(_line(g, report["seed"]) for g in report["groups"]),
        _scaling(report),
    ]
    return "".join(parts)
