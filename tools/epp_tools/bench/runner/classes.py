"""Outcomes per traffic class (InferenceObjective) and per tenant (fairness id).

Per class: requests sent, served (HTTP 200 with tokens), refused with 429 (split by the
``x-llm-d-request-dropped-reason`` header; an answer without one is listed as ``no header:
<message>``), 503, anything else (timeouts, other statuses), and the TTFT p50/p99 of the served
ones (wall-clock ms).

Per tenant of one class: sent, served, its share of what the class was served, and its
**max-min fair share** (equal shares, except that a tenant asking for less than an equal share
gets all it asked for and the rest is split equally among the others)::

    fair = water-fill(total served, demands = requests sent per tenant)
    deviation = served / fair - 1

so with tenants sending 10:1, the light tenant's fair share is everything it sent as long as
that is less than half of what the class was served.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.workloads.text import percentile


def _ms(values: Sequence[float], q: float) -> float:
    return round(percentile(values, q) * 1000.0, 3)


def refusal(o: Outcome) -> str:
    """Why a request was refused: the drop-reason header, else the body's message."""
    if o.reason:
        return o.reason
    _, sep, message = o.error.partition(" - ")
    return "no header: " + (message if sep else o.error).strip()[:48]


def class_stats(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Class name -> sent, served, 429s (by reason), 503s, other errors, TTFT p50/p99."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({o.objective for o in outcomes if o.objective}):
        mine = [o for o in outcomes if o.objective == name]
        served = [o for o in mine if o.ok]
        rejected = [o for o in mine if o.status == 429]
        ttfts = [o.ttft for o in served]
        out[name] = {
            "sent": len(mine),
            "served": len(served),
            "rejected_429": len(rejected),
            "reasons_429": dict(sorted(Counter(refusal(o) for o in rejected).items())),
            "unavailable_503": sum(o.status == 503 for o in mine),
            "other_errors": sum(not o.ok and o.status not in (429, 503) for o in mine),
            "ttft_p50_ms": _ms(ttfts, 0.5),
            "ttft_p99_ms": _ms(ttfts, 0.99),
        }
    return out


def max_min_shares(demands: Mapping[str, int], total: int) -> dict[str, float]:
    """Water-filling: split ``total`` equally, capping each tenant at its demand."""
    fair = dict.fromkeys(demands, 0.0)
    left = float(min(total, sum(demands.values())))
    open_ = sorted(demands, key=lambda t: demands[t])
    while open_ and left > 1e-9:  # bounded: one tenant leaves the open set per pass at most
        equal = left / len(open_)
        smallest = open_[0]
        if demands[smallest] - fair[smallest] <= equal:
            give = demands[smallest] - fair[smallest]
            fair[smallest] += give
            left -= give
            open_.pop(0)
            continue
        for t in open_:
            fair[t] += equal
        left = 0.0
    return fair


def tenant_stats(outcomes: Sequence[Outcome], objective: str) -> dict[str, dict[str, float]]:
    """Tenant -> sent, served, share of the class's served requests, fair share, deviation."""
    mine = [o for o in outcomes if o.objective == objective and o.tenant]
    sent = Counter(o.tenant for o in mine)
    served = Counter(o.tenant for o in mine if o.ok)
    total = sum(served.values())
    fair = max_min_shares(dict(sent), total)
    out: dict[str, dict[str, float]] = {}
    for tenant in sorted(sent):
        ttfts = [o.ttft for o in mine if o.tenant == tenant and o.ok]
        out[tenant] = {
            "sent": sent[tenant],
            "served": served[tenant],
            "share": served[tenant] / total if total else 0.0,
            "fair_share": fair[tenant] / total if total else 0.0,
            "deviation": served[tenant] / fair[tenant] - 1.0 if fair[tenant] else 0.0,
            "ttft_p50_ms": _ms(ttfts, 0.5),
            "ttft_p99_ms": _ms(ttfts, 0.99),
        }
    return out
