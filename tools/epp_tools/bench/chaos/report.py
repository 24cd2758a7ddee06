"""What ``epp bench chaos`` measured, as one row per scenario and a Markdown table.

Columns: requests and failed requests over the whole run; *attributed*: failures the fault
explains (requests in flight on the pod or EPP at the moment it was killed, requests routed to a
dead pod before the EPP noticed, requests sent while a fail-closed EPP was down); *unexplained*:
the other failures (the verdict wants 0); *stop routing*: milliseconds from the fault to the last
request that still went to the faulted pod (sent time; ``-`` when none did); *recovery*: seconds
from the end of the fault (EPP restarted, API server back) to what the scenario waits for;
*verdict*: whether the expected client-visible outcome held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from epp_tools.bench.chaos.load import Shot, failures


@dataclass
class Row:
    scenario: str
    fault: str
    expected: str
    requests: int = 0
    failed: int = 0
    attributed: int = 0
    stop_routing_ms: float = math.nan
    recovery_s: float = math.nan
    ok: bool = False
    notes: list[str] = field(default_factory=list)
    failure_kinds: str = ""

    @property
    def unexplained(self) -> int:
        return self.failed - self.attributed

    def count(self, shots: Sequence[Shot]) -> None:
        self.requests = len(shots)
        self.failed = len(failures(shots))
        self.failure_kinds = kinds(shots)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["unexplained"] = self.unexplained
        for key in ("stop_routing_ms", "recovery_s"):
            if isinstance(out[key], float) and math.isnan(out[key]):
                out[key] = None
        return out


def kinds(shots: Sequence[Shot], limit: int = 3) -> str:
    """The most common kinds among ``shots``' failures: status, pod and the start of the error."""
    counts: dict[str, int] = {}
    for s in failures(shots):
        key = f"{s.status} {s.pod or 'no pod'} {s.error[:50]}".strip()
        counts[key] = counts.get(key, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return "; ".join(f"{n} x {k}" for k, n in top) or "none"


def _num(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def render(rows: Sequence[Row], header: str = "") -> str:
    lines = [header] if header else []
    lines += [
        "| scenario | fault | expected outcome | requests | failed | attributed | unexplained "
        "| stop routing (ms) | recovery (s) | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.fault} | {r.expected} | {r.requests:,} | {r.failed:,} "
            f"| {r.attributed:,} | {r.unexplained:,} | {_num(r.stop_routing_ms, 0)} "
            f"| {_num(r.recovery_s, 2)} | {'as expected' if r.ok else 'NOT as expected'} |"
        )
    notes = [f"- {r.scenario}: {note}" for r in rows for note in r.notes]
    notes += [f"- {r.scenario} failures: {r.failure_kinds}" for r in rows if r.failed]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines) + "\n"
