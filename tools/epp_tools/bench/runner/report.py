"""The report of a benchmark run: ``results.json``, ``report.md`` (Markdown tables) and plots.

The JSON holds everything (run settings, per workload: fleet, shape, oracle, and per target
every ``TargetResult`` field including the raw TTFT samples); the Markdown and the PNGs are
rendered from it alone, so ``render_markdown(json.load(...))`` reproduces a report.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from epp_tools.bench.runner import overload_report

NOTES: tuple[str, ...] = (
    "hit = the pods' prefix-cache hit tokens / prompt tokens (simulator counters); "
    "% of oracle = hit / the workload's achievable reuse (longest block-aligned prefix each "
    "request shares with what earlier requests left in an unbounded cache, see "
    "tools/epp_tools/bench/workloads/oracle.py).",
    "TTFT and ITL are wall-clock ms measured by the client on keep-alive connections; the "
    "simulator runs faster than real time (time scale per workload), so model-server time is "
    "compressed while router overhead is not. 'probe fresh / reused' is the TTFT p50 of a "
    "separate probe (10 sequential small requests, each on a new connection, then 10 on one "
    "reused connection): sglang-router 0.3 adds ~40 ms to streamed responses on reused "
    "connections (no TCP_NODELAY on client sockets), which also shows as a near-zero ITL "
    "(the delayed chunks arrive together) and inflates its keep-alive TTFT.",
    "imbalance = requests on the busiest pod / mean per pod. CPU ms/req = utime+stime of the "
    "target's processes (EPP + Envoy, Envoy alone, or the router) during the measured phase "
    "per successful request, split by process when there are several; net of idle = the same "
    "less each process's CPU rate with no traffic, measured over 4 s before the run, times the "
    "run's length (the EPP's scraping of the pods is a rate, not a cost per request); peak RSS "
    "= VmHWM.",
    "colocation = share of a session's turns (after the first, both served) answered by the "
    "same pod as its previous turn (x-sim-pod). follow-up ok = share of Responses API "
    "follow-ups (previous_response_id) answered 200 rather than 404 (a 404 is resent at once "
    "as a new chain with the whole conversation, its lost round trip counted in that turn's "
    "TTFT). See tools/epp_tools/bench/runner/sessions.py.",
    "Foreign load (b-foreign): pod-0 is kept busy by requests sent straight to its port, which "
    "the target never sees; busy-pod share = the target's requests that went to pod-0 (ideal: "
    "well below 1/N), others imbalance = busiest other pod / mean of the other pods. The "
    "simulator's counters include the foreign requests, so per-pod load, imbalance and hit "
    "ratio there come from the target's own answers (x-sim-pod, usage.cached_tokens).",
    "b-pressure: the oracle ignores KV capacity (as for every workload), so with the fleet's "
    "KV at 1.6x the hot set and one small pod its achievable reuse is an upper bound: the gap "
    "below it is what a router's placement loses to evictions.",
    "vs best peer = value / the best among sglang-router and vllm-router (the Envoy baselines "
    "if neither ran); > 1 is better for hit and tok/s, < 1 is better for TTFT.",
    "Workload (d) sends x-llm-d-inference-objective (priorities from a generated "
    "--objectives-file) and x-llm-d-inference-fairness-id; its per-class table counts a request "
    "as served when it streamed tokens with HTTP 200; 429 reasons are the "
    "x-llm-d-request-dropped-reason header ('no header: ...' = the body's message when the "
    "answer had none). EPP memory: RSS after warm-up -> peak (VmHWM) and the peak of "
    "llm_d_epp_flow_control_queue_bytes polled every 250 ms, against the config's maxBytes.",
)


def _pct(x: float) -> str:
    return f"{x * 100:.1f}%"


def _num(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _ratios(r: Mapping[str, Any]) -> str:
    v = r.get("vs_best_peer") or {}
    keys = ("oracle_share", "ttft_p90_ms", "out_tok_per_s")
    if not any(k in v for k in keys):
        return "-"
    return " · ".join(f"{v[k]:.2f}" if k in v else "-" for k in keys)


_HEAD: tuple[str, ...] = (
    "target", "ok / err", "hit", "% of oracle", "TTFT p50", "p90", "p99",
    "probe fresh / reused", "ITL p50", "req/s", "out tok/s", "imbalance", "CPU ms/req",
    "net of idle", "peak RSS MB", "vs best peer (hit · p90 · tok/s)",
)  # fmt: skip
_SESSION_AT = 4
"""The session columns go right after "% of oracle"."""


def _opt_pct(x: float | None) -> str:
    return "-" if x is None else _pct(x)


def _followup_cell(r: Mapping[str, Any]) -> str:
    if r.get("followup_success") is None:
        return "-"
    return f"{_pct(r['followup_success'])} of {r['followups']}"


def _imbalance_cell(r: Mapping[str, Any]) -> str:
    x = r.get("others_imbalance")
    return "-" if x is None else f"{x:.2f}"


_SESSION_COLUMNS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("colocation", "colocation", lambda r: _opt_pct(r.get("colocation"))),
    ("follow-up ok", "followup_success", _followup_cell),
    ("busy-pod share", "busy_pod_share", lambda r: _opt_pct(r.get("busy_pod_share"))),
    ("others imbalance", "others_imbalance", _imbalance_cell),
)


def session_columns(
    results: Sequence[Mapping[str, Any]],
) -> list[tuple[str, Callable[[Mapping[str, Any]], str]]]:
    """The session columns some target of this workload has a value for."""
    return [
        (head, cell)
        for head, key, cell in _SESSION_COLUMNS
        if any(r.get(key) is not None for r in results)
    ]


def _cpu_cell(r: Mapping[str, Any], net: bool = False) -> str:
    """Total CPU per request and, for a target of several processes, each one's share; ``net``:
    less each process's idle rate ("-" for a result measured without it)."""
    total = r.get("cpu_ms_per_req_net") if net else r["cpu_ms_per_req"]
    cpu = r.get("cpu_net_s" if net else "cpu_s") or {}
    if total is None:
        return "-"
    if len(cpu) < 2 or not r.get("ok"):
        return _num(total, 2)
    parts = " · ".join(f"{name} {_num(s * 1000.0 / r['ok'], 2)}" for name, s in cpu.items())
    return f"{_num(total, 2)} ({parts})"


def _row(r: Mapping[str, Any], extra: Sequence[Callable[[Mapping[str, Any]], str]] = ()) -> str:
    rss = sum((r.get("peak_rss_mb") or {}).values())
    cells = [
        r["label"],
        f"{r['ok']} / {r['errors']}",
        _pct(r["hit_ratio"]),
        _pct(r["oracle_share"]),
        _num(r["ttft_p50_ms"]),
        _num(r["ttft_p90_ms"]),
        _num(r["ttft_p99_ms"]),
        f"{_num(r['ttft_fresh_p50_ms'])} / {_num(r['ttft_reused_p50_ms'])}",
        _num(r["itl_p50_ms"], 2),
        _num(r["req_per_s"]),
        _num(r["out_tok_per_s"], 0),
        f"{r['imbalance']:.2f}",
        _cpu_cell(r),
        _cpu_cell(r, net=True),
        _num(rss, 0),
        _ratios(r),
    ]
    cells[_SESSION_AT:_SESSION_AT] = [cell(r) for cell in extra]
    return "| " + " | ".join(cells) + " |"


def table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-target table, with the session columns that apply."""
    extra = session_columns(results)
    head = list(_HEAD)
    head[_SESSION_AT:_SESSION_AT] = [h for h, _ in extra]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + [_row(r, [cell for _, cell in extra]) for r in results]


def _foreign_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        f = r.get("foreign_load") or {}
        if f:
            lines.append(
                f"- {r['label']}: {r['busy_pod']} had {f['mean_waiting']:.1f} requests waiting "
                f"on average (max {f['max_waiting']}) and {f['mean_running']:.1f} running; "
                f"{f['served']} foreign requests served, {f['failed']} failed"
            )
    return ["", "Foreign load during each run:", "", *lines] if lines else []


def _epp_line(results: Sequence[Mapping[str, Any]]) -> list[str]:
    for r in results:
        if r["target"].startswith("epp") and r["ok"]:
            cpu = r["cpu_s"].get("epp", 0.0) * 1000.0 / r["ok"]
            envoy = r["cpu_s"].get("envoy", 0.0) * 1000.0 / r["ok"]
            rss = r["peak_rss_mb"].get("epp", 0.0)
            idle = (r.get("idle_cores") or {}).get("epp")
            net = (r.get("cpu_net_s") or {}).get("epp")
            net_text = (
                f" ({net * 1000.0 / r['ok']:.2f} net of its idle {idle * 100:.1f}% of a core "
                f"over the {r['measured_s']:.1f} s run)"
                if idle is not None and net is not None
                else ""
            )
            return [
                "",
                f"EPP process alone: {cpu:.2f} ms CPU per request{net_text}, peak RSS {rss:.0f} "
                f"MB (its Envoy: {envoy:.2f} ms CPU per request).",
            ]
    return []


def _pd_lines(w: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> list[str]:
    """For a workload with a P/D fleet: latency and where prefill ran, per target."""
    pd = w.get("pd_fleet") or {}
    if not pd:
        return []
    lines = [
        "",
        f"P/D targets run on the same pods as {', '.join(pd['pod_roles'])} (KV transfer "
        f"{pd['kv_transfer_ms_per_block']:g} simulated ms per block); the others aggregated.",
        "",
    ]
    for r in results:
        lines.append(
            f"- {r['label']}: TTFT p50 {_num(r['ttft_p50_ms'])} ms, p90 {_num(r['ttft_p90_ms'])} "
            f"ms; ITL p50 {_num(r['itl_p50_ms'], 2)} ms, p90 {_num(r.get('itl_p90_ms', 0.0), 2)} "
            f"ms; {_num(r['out_tok_per_s'], 0)} output tok/s; prefilled on another pod: "
            f"{_pct(r.get('remote_prefill_share', 0.0))} of requests "
            f"({r.get('kv_transfer_blocks', 0):,} KV blocks pulled)"
        )
    return lines


def _fleet_words(fleet: Mapping[str, Any]) -> str:
    kv = fleet.get("pod_kv_tokens") or [fleet["kv_tokens_per_pod"]] * fleet["pods"]
    if len(set(kv)) > 1:
        sizes = " / ".join(f"{k:,}" for k in kv)
        return f"fleet {fleet['pods']} pods with {sizes} KV tokens"
    return f"fleet {fleet['pods']} pods x {kv[0]:,} KV tokens"


def _shape_lines(shape: Mapping[str, Any]) -> list[str]:
    lines = []
    if "share_turns_reuse_ge_90" in shape:
        lines.append(
            f"Shape: median input {shape['median_input_tokens']:,.0f} tokens, median output "
            f"{shape['median_output_tokens']:.0f}, "
            f"{_pct(shape['share_turns_reuse_ge_90'])} of turns reuse >= 90% "
            f"(median reuse {_pct(shape['median_reuse'])})."
        )
    if "hot_set_tokens" in shape:
        lines.append(
            f"Shape: {shape['sessions']} sessions, {shape['subagents']} sub-agents, "
            f"{shape['oneshots']} one-shots, {shape['compactions']} compactions; median input "
            f"{shape['median_input_tokens']:,.0f} tokens; hot set {shape['hot_set_tokens']:,} "
            f"tokens, fleet KV {shape['fleet_kv_tokens']:,}."
        )
    return lines


def render_workload(w: Mapping[str, Any]) -> list[str]:
    fleet, oracle = w["fleet"], w["oracle"]
    lines = [
        f"## ({w['name']}) {w['title']}",
        "",
        f"{w['description']}. {w['requests']} requests, in-flight cap {w['concurrency']}; "
        f"{_fleet_words(fleet)}, time scale {fleet['time_scale']:g}; oracle's achievable reuse "
        f"**{_pct(oracle['achievable_reuse'])}**.",
    ]
    lines += _shape_lines(w.get("shape") or {})
    ran = [r for r in w["results"] if r["status"] == "ok"]
    lines += ["", *table(ran)]
    for r in w["results"]:
        if r["status"] != "ok":
            lines.append(f"\n{r['label']}: {r['status']} ({r['reason']})")
    lines += _epp_line(ran)
    lines += _pd_lines(w, ran)
    lines += _foreign_lines(ran)
    lines += overload_report.render(w)
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    run = report["run"]
    lines = [
        "# epp bench",
        "",
        f"{run['started']}; scale `{run['scale']}`, seed {run['seed']}, {run['cpus']} CPUs, "
        f"targets {', '.join(run['targets'])}.",
        "",
        *(
            [
                f"Command: `{run['command']}`. Machine: {run['machine']}; load average "
                f"{' / '.join(map(str, run['load_average'][:3]))} at the start, "
                f"{' / '.join(map(str, run['load_average'][3:]))} at the end.",
                "",
            ]
            if "command" in run
            else []
        ),
    ]
    for w in report["workloads"]:
        lines += render_workload(w)
        lines.append("")
    lines += ["## Notes", ""] + [f"- {n}" for n in NOTES]
    return "\n".join(lines) + "\n"


def write(report: Mapping[str, Any], out: Path) -> list[Path]:
    """Write ``results.json``, ``report.md`` and the plots; return the written paths."""
    from epp_tools.bench.runner.plots import draw_all

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "report.md"]
    paths[0].write_text(json.dumps(report, indent=1))
    paths[1].write_text(render_markdown(report))
    paths += draw_all(report, out)
    return paths
