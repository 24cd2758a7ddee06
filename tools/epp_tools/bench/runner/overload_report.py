"""The overload workload's own tables: the targets of the issue, per class, per tenant, memory.

The targets (each judged per EPP target, the default config being the baseline):

* latency-sensitive: ``p99 TTFT <= 1.5 x`` the p99 of the same requests alone on an idle fleet
  (one reference run, through the flow-control config, see ``epp_tools.bench.runner.run``; every EPP
  target is compared with it), and none of them dropped (not served, whatever the status);
* tenants: each tenant's served requests within 10% of its max-min fair share of what the
  agentic class was served (``epp_tools.bench.runner.classes``);
* sheddable traffic absorbs the shedding: every refused sheddable request (priority < 0) is a
  429 with an ``x-llm-d-request-dropped-reason`` header, and the share of requests dropped never
  grows with priority (sheddable >= agentic >= latency-sensitive);
* EPP memory: the peak of the flow-control queue bytes (polled) stays under each band's
  ``maxBytes`` and the global ``maxBytes``; the EPP's RSS after warm-up and at its peak are
  shown beside (a process without flow control queues nothing).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

TTFT_FACTOR = 1.5
SHARE_TOLERANCE = 0.10


def _dropped(c: Mapping[str, Any]) -> int:
    return int(c["sent"]) - int(c["served"])


def _rate(c: Mapping[str, Any] | None) -> float:
    return _dropped(c) / c["sent"] if c and c["sent"] else 0.0


def _reasons(reasons: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in reasons.items()) or "-"


def _mark(ok: bool | None) -> str:
    return {True: "holds", False: "**misses**", None: "n/a"}[ok]


def latency_verdict(
    r: Mapping[str, Any], name: str, ref: Mapping[str, Any]
) -> tuple[str, bool | None]:
    c = r["classes"].get(name)
    if not c or ref.get("status") != "ok" or not ref.get("ttft_p99_ms"):
        return "no idle reference", None
    ratio = c["ttft_p99_ms"] / ref["ttft_p99_ms"]
    text = (
        f"p99 {c['ttft_p99_ms']:.0f} ms = {ratio:.2f}x idle ({ref['ttft_p99_ms']:.0f} ms); "
        f"dropped {_dropped(c)}/{c['sent']}"
    )
    return text, ratio <= TTFT_FACTOR and _dropped(c) == 0


def tenant_verdict(r: Mapping[str, Any]) -> tuple[str, bool | None]:
    parts, worst = [], 0.0
    for tenants in (r.get("tenants") or {}).values():
        for t, s in tenants.items():
            parts.append(
                f"{t} {s['served']}/{s['sent']} = {s['share']:.1%} of served "
                f"(fair {s['fair_share']:.1%}, {s['deviation']:+.1%})"
            )
            worst = max(worst, abs(s["deviation"]))
    if not parts:
        return "no tenants", None
    return "; ".join(parts), worst <= SHARE_TOLERANCE


def shedding_verdict(
    r: Mapping[str, Any], priorities: Mapping[str, int]
) -> tuple[str, bool | None]:
    classes = r["classes"]
    order = sorted((n for n in priorities if n in classes), key=lambda n: priorities[n])
    sheddable = [n for n in order if priorities[n] < 0]
    rates = [_rate(classes[n]) for n in order]
    monotone = all(a >= b for a, b in itertools.pairwise(rates))
    with_reason = all(
        _dropped(classes[n])
        == sum(v for k, v in classes[n]["reasons_429"].items() if not k.startswith("no header"))
        for n in sheddable
    )
    text = "; ".join(
        f"{n} dropped {_dropped(classes[n])}/{classes[n]['sent']} "
        f"({_reasons(classes[n]['reasons_429'])})"
        if priorities[n] < 0
        else f"{n} dropped {_dropped(classes[n])}/{classes[n]['sent']}"
        for n in order
    )
    return text, monotone and with_reason


def memory_verdict(r: Mapping[str, Any], names: Mapping[int, str]) -> tuple[str, bool | None]:
    mem = r.get("epp_memory") or {}
    rss = f"RSS {mem.get('rss_start_mb', 0):.0f} -> {r['peak_rss_mb'].get('epp', 0):.0f} MB"
    caps, queue = mem.get("caps") or {}, mem.get("queue") or {}
    if not caps:
        return f"no flow-control queue; {rss}", None
    peaks = queue.get("peak_bytes") or {}
    parts, ok = [], True
    for prio, cap in caps.items():
        if prio == "global":
            peak = queue.get("peak_total_bytes", 0)
            label = "all bands"
        else:
            peak = peaks.get(prio, 0)
            label = names.get(int(prio), prio)
        if cap:
            parts.append(f"{label} {peak / 1024:,.0f} of {cap / 1024:,.0f} KiB")
            ok = ok and peak <= cap
    return f"queue peak: {', '.join(parts)}; {rss}", ok


def _epp_results(w: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [
        r
        for r in w["results"]
        if r["status"] == "ok" and r["target"].startswith("epp") and r.get("classes")
    ]


def targets_table(w: Mapping[str, Any]) -> list[str]:
    results = _epp_results(w)
    priorities = {n: int(p) for n, p in w.get("objectives") or []}
    names = {p: n for n, p in priorities.items()}
    ref, idle = w.get("reference_objective", ""), w.get("reference") or {}
    if not results or not ref:
        return []
    rows: list[tuple[str, str, list[tuple[str, bool | None]]]] = [
        (f"{ref} requests", f"p99 TTFT <= {TTFT_FACTOR:g}x idle, none dropped",
         [latency_verdict(r, ref, idle) for r in results]),
        ("tenants under program-aware-fairness", "within 10% of equal (max-min) share",
         [tenant_verdict(r) for r in results]),
        ("sheddable traffic", "absorbs the shedding, 429s with reasons",
         [shedding_verdict(r, priorities) for r in results]),
        ("EPP memory", "under the configured byte caps",
         [memory_verdict(r, names) for r in results]),
    ]  # fmt: skip
    lines = [
        "",
        "Overload targets:",
        "",
        "| aspect | target | " + " | ".join(r["label"] for r in results) + " |",
        "|" + "---|" * (len(results) + 2),
    ]
    for aspect, target, verdicts in rows:
        cells = [f"{text} ({_mark(ok)})" for text, ok in verdicts]
        lines.append(f"| {aspect} | {target} | " + " | ".join(cells) + " |")
    return lines


def class_table(w: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> list[str]:
    priorities = {n: int(p) for n, p in w.get("objectives") or []}
    present = {n for r in results for n in r.get("classes") or {}}
    if not present:
        return []
    order = sorted(present, key=lambda n: (-priorities.get(n, 0), n))
    lines = [
        "",
        "Per class (TTFT in ms; idle fleet = the class alone on an idle fleet):",
        "",
        "| target | class | sent | served | 429 (reasons) | 503 | other | TTFT p50 | p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for n in order:
            c = (r.get("classes") or {}).get(n)
            if c:
                lines.append(_class_row(r["label"], n, c, priorities.get(n)))
    ref = w.get("reference") or {}
    if ref.get("status") == "ok":
        lines.append(_class_row(ref["label"], f"{ref['objective']}, idle fleet", ref, None))
    return lines


def _class_row(label: str, name: str, c: Mapping[str, Any], priority: int | None) -> str:
    shown = f"{name} ({priority})" if priority is not None else name
    cells = [
        label, shown, str(c["sent"]), str(c["served"]),
        f"{c['rejected_429']} ({_reasons(c['reasons_429'])})" if c["rejected_429"] else "0",
        str(c["unavailable_503"]), str(c["other_errors"]),
        f"{c['ttft_p50_ms']:,.0f}", f"{c['ttft_p99_ms']:,.0f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def tenant_table(results: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = []
    for r in results:
        for name, tenants in (r.get("tenants") or {}).items():
            for t, s in tenants.items():
                rows.append(
                    f"| {r['label']} | {name} | {t} | {s['sent']} | {s['served']} | "
                    f"{s['share']:.1%} | {s['fair_share']:.1%} | {s['deviation']:+.1%} | "
                    f"{s['ttft_p50_ms']:,.0f} / {s['ttft_p99_ms']:,.0f} |"
                )
    if not rows:
        return []
    return [
        "",
        "Per tenant (share = of the class's served requests; fair = max-min fair share):",
        "",
        "| target | class | tenant | sent | served | share | fair | deviation | TTFT p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]


def render(w: Mapping[str, Any]) -> list[str]:
    ran = [r for r in w["results"] if r["status"] == "ok"]
    return targets_table(w) + class_table(w, ran) + tenant_table(ran)
