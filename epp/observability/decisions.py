"""The explain view: a bounded log of recent routing decisions and why they were made.

Every request that reaches scheduling leaves one entry: the request (id, path, models, objective,
priority, fairness id), the candidates, each profile's targets, every candidate's weighted total
and, when the scheduler captured it, each scorer's clamped score per candidate; or the error the
request got. Entries are kept in a ring buffer (``capacity``, default 512), so memory is bounded
whatever the traffic. Served on the metrics port:

- ``GET /debug/decisions?limit=N`` — the newest N entries, newest first;
- ``GET /debug/decisions/<request id>`` — one entry.

Client-chosen strings (request id, path, model names, objective, fairness id, the error text) are
kept to their first ``MAX_FIELD_CHARS`` (256) characters, ``…`` marking a cut, so an entry stays
small whatever a client sends: with the default capacity the log holds at most a few MB. The log
keeps a model name as the client sent it (clipped), not its metric label, since this view is for
explaining one request.

The scheduler captures per-scorer scores for every request with at most ``breakdown_limit``
candidates (default 64), and for any request carrying the header ``x-epp-explain: true``;
totals are always recorded.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from epp.plugin import Endpoint, InferenceRequest, SchedulingResult

EXPLAIN_KEY: Final = "epp.explain"
"""``InferenceRequest.attributes`` key where the scheduler leaves per-scorer scores."""
EXPLAIN_HEADER: Final = "x-epp-explain"
MAX_FIELD_CHARS: Final = 256
_TOP: Final = 16


def clip(value: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``value`` cut to ``limit`` characters, the cut marked with ``…``."""
    return value if len(value) <= limit else value[: limit - 1] + "…"


def loggable(value: object, limit: int = 128) -> str:
    """A client-chosen string as a log line may carry it: cut to ``limit`` characters and with
    every non-printable character (newline, escape, ...) escaped, so one request can neither
    forge log lines nor write a megabyte into one."""
    text = clip(str(value), limit)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class DecisionLog:
    def __init__(self, capacity: int = 512) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def _put(self, request_id: str, entry: dict[str, Any]) -> None:
        request_id = clip(request_id)
        self._entries.pop(request_id, None)
        self._entries[request_id] = entry
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def record(
        self,
        request: InferenceRequest,
        result: SchedulingResult,
        candidates: Sequence[Endpoint],
        seconds: float,
    ) -> None:
        self._put(request.request_id, decision_entry(request, result, candidates, seconds))

    def record_error(
        self, request: InferenceRequest | None, status: int, message: str, drop_reason: str | None
    ) -> None:
        if request is None:
            return
        self._put(
            request.request_id,
            {
                **_request_fields(request),
                "outcome": "rejected",
                "status": status,
                "error": clip(message),
                **({"dropReason": drop_reason} if drop_reason else {}),
            },
        )

    def get(self, request_id: str) -> dict[str, Any] | None:
        return self._entries.get(clip(request_id))

    def latest(self, limit: int) -> list[dict[str, Any]]:
        items = list(self._entries.values())[-max(0, limit) :]
        items.reverse()
        return items


def decision_entry(
    request: InferenceRequest,
    result: SchedulingResult,
    candidates: Sequence[Endpoint],
    seconds: float,
    top: int = _TOP,
) -> dict[str, Any]:
    """One scheduled request's entry: each profile's targets and its ``top`` candidates by
    weighted total, with the per-scorer scores the scheduler captured."""
    breakdown: Mapping[str, Mapping[str, float]] = request.attributes.get(EXPLAIN_KEY) or {}
    # the ``top`` best of each profile (as a stable sort would rank them, without sorting all)
    rankings = {
        name: heapq.nlargest(top, res.scores.items(), key=itemgetter(1))
        for name, res in result.profile_results.items()
    }
    wanted = {eid for ranked in rankings.values() for eid, _ in ranked}
    by_id = {e.id: e for e in candidates if e.id in wanted}
    profiles = {}
    for name, res in result.profile_results.items():
        ranked = rankings[name]
        profiles[name] = {
            "targets": [e.hostport for e in res.targets],
            "scores": [
                {
                    "endpoint": by_id[eid].hostport if eid in by_id else eid,
                    "id": eid,
                    "total": round(total, 6),
                    **({"scorers": dict(breakdown[eid])} if eid in breakdown else {}),
                }
                for eid, total in ranked
            ],
        }
    return {
        **_request_fields(request),
        "candidates": len(candidates),
        "primaryProfile": result.primary_profile,
        "profiles": profiles,
        "schedulingSeconds": round(seconds, 6),
        "outcome": "scheduled",
    }


def _request_fields(request: InferenceRequest) -> dict[str, Any]:
    return {
        "requestId": clip(request.request_id),
        "time": time.time(),
        "path": clip(request.path),
        "model": clip(request.incoming_model),
        "targetModel": clip(request.target_model),
        "objective": clip(request.objective),
        "priority": request.priority,
        "fairnessId": clip(request.fairness_id),
        "bodyBytes": request.size_bytes,
    }
