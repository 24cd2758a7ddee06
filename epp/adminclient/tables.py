"""Readable tables of the admin API's answers."""

from __future__ import annotations

import json
from collections.abc import Sequence

from epp._proto import epp_admin_v1_pb2 as pb


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in [header, *rows]]  # fmt: skip
    return "\n".join(lines) + "\n"


def explain(r: pb.ExplainResponse) -> str:
    model = r.model + (f" -> {r.target_model}" if r.target_model != r.model else "")
    out = f"request {r.request_id}  path {r.path}  model {model or '-'}\n"
    if r.outcome != "scheduled":
        return out + f"rejected: {r.status} {r.error}\n"
    out += (f"candidates {r.candidates}  primary profile {r.primary_profile}  "
            f"destination {r.destination}\n")  # fmt: skip
    for profile in r.profiles:
        scorers = sorted({name for s in profile.scores for name in s.scorers})
        rows = [
            [s.endpoint, "*" if s.endpoint in profile.targets else "", f"{s.total:.4f}",
             *(f"{s.scorers[n]:.4f}" if n in s.scorers else "-" for n in scorers)]
            for s in profile.scores
        ]  # fmt: skip
        out += f"\nprofile {profile.name}\n"
        out += table(["ENDPOINT", "PICKED", "TOTAL", *scorers], rows)
    return out


def endpoints(r: pb.ListEndpointsResponse) -> str:
    rows = [
        [e.address, e.id, e.role or "-", str(e.rank),
         f"{e.age_seconds:.1f}s" if e.scraped else "never",
         str(e.waiting_queue_size), str(e.running_requests_size),
         f"{e.kv_cache_usage_percent * 100:.1f}%", ",".join(e.active_models) or "-",
         ",".join(f"{k}={v}" for k, v in sorted(e.attributes.items())) or "-"]
        for e in r.endpoints
    ]  # fmt: skip
    header = ["ENDPOINT", "ID", "ROLE", "RANK", "AGE", "WAITING", "RUNNING", "KV", "MODELS",
              "ATTRIBUTES"]  # fmt: skip
    return table(header, rows)


def state(r: pb.DumpStateResponse) -> str:
    flow = r.flow_control
    out = "flow control: " + (
        f"{flow.in_flight} in flight, queued by priority "
        + (", ".join(f"{p}: {n}" for p, n in sorted(flow.queued_by_priority.items())) or "none")
        if flow.enabled
        else "off"
    )
    sharing = r.sharing
    out += "\nsharing: " + (
        f"lag {sharing.lag_seconds:.2f}s, bootstrapped {sharing.bootstrapped}, "
        f"outbox {sharing.outbox_facts} facts"
        if sharing.enabled
        else "off"
    )
    out += "\n"
    for p in r.plugins:
        out += f"\n{p.type}/{p.name}\n{json.dumps(json.loads(p.json), indent=2)}\n"
    return out
