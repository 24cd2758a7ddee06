"""What ``epp bench day2`` measured: one row per scenario and a Markdown table.

Columns: requests and failed requests over the whole run; the hit ratio (cached / prompt tokens
the model servers reported) before the event, during it and after it; the TTFT added during the
event at the median and the 95th percentile (during less before, milliseconds); *recovery*:
seconds from the end of the event until a 2-second window of requests is back at 95% of the hit
ratio before it (0: it never dropped below; ``-``: not measured); the target, and whether it held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from epp_tools.bench.day2.rig import Phases
from epp_tools.bench.runner.agentload import failed, failure_kinds
from epp_tools.bench.runner.driver import Outcome


@dataclass
class Row:
    scenario: str
    event: str
    target: str
    requests: int = 0
    failed: int = 0
    hit_before: float = math.nan
    hit_during: float = math.nan
    hit_after: float = math.nan
    added_ttft_p50_ms: float = math.nan
    added_ttft_p95_ms: float = math.nan
    recovery_s: float = math.nan
    ok: bool = False
    notes: list[str] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    """The scenario's own measurements (gap, retries, ejections...), by name."""

    def measure(self, outcomes: Sequence[Outcome], phases: Phases) -> None:
        self.requests = len(outcomes)
        self.failed = failed(outcomes)
        self.failures = failure_kinds(outcomes)
        self.hit_before, self.hit_during, self.hit_after = phases.hits()
        self.added_ttft_p50_ms, self.added_ttft_p95_ms = phases.added_ttft_ms()

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        for key, value in out.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
        out["figures"] = {k: (v if math.isfinite(v) else None) for k, v in self.figures.items()}
        return out


def _num(value: float, digits: int) -> str:
    return "-" if not math.isfinite(value) else f"{value:,.{digits}f}"


def _pct(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{100 * value:.1f}%"


def render(rows: Sequence[Row], header: str = "") -> str:
    lines = [header] if header else []
    lines += [
        "| scenario | event | requests | failed | hit before / during / after "
        "| added TTFT p50 / p95 (ms) | recovery (s) | target | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        hits = " / ".join(_pct(h) for h in (r.hit_before, r.hit_during, r.hit_after))
        added = f"{_num(r.added_ttft_p50_ms, 0)} / {_num(r.added_ttft_p95_ms, 0)}"
        lines.append(
            f"| {r.scenario} | {r.event} | {r.requests:,} | {r.failed:,} | {hits} | {added} "
            f"| {_num(r.recovery_s, 1)} | {r.target} | {'met' if r.ok else 'NOT met'} |"
        )
    notes = [f"- {r.scenario}: {note}" for r in rows for note in r.notes]
    notes += [
        f"- {r.scenario} failures: " + "; ".join(f"{n} x {k}" for k, n in r.failures.items())
        for r in rows
        if r.failed
    ]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"
