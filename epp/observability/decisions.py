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

An entry is written when it is read: a scheduled request leaves what the scheduler already built
(its request fields, its result with every candidate's total, the candidates, the scores the
scheduler captured) and the ranking of its top candidates is made the first time the view shows
it. So the request path pays an append, not a ranking of every candidate (about 35 us at 256
pods); the price is memory: an unread entry holds its totals, one float per candidate (at 256
pods and the default capacity, about 8 MB).
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, Final, NamedTuple

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


class _Scheduled(NamedTuple):
    """A scheduled request's entry, not written yet (see the module docstring)."""

    fields: dict[str, Any]
    result: SchedulingResult
    candidates: Sequence[Endpoint]
    seconds: float
    breakdown: Mapping[str, Mapping[str, float]]

    def entry(self) -> dict[str, Any]:
        return _scheduled_entry(
            self.fields, self.result, self.candidates, self.seconds, self.breakdown, _TOP
        )


class DecisionLog:
    def __init__(self, capacity: int = 512) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, dict[str, Any] | _Scheduled] = OrderedDict()

    def _put(self, request_id: str, entry: dict[str, Any] | _Scheduled) -> None:
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
        breakdown = request.attributes.get(EXPLAIN_KEY) or {}
        fields = _request_fields(request)
        self._put(request.request_id, _Scheduled(fields, result, candidates, seconds, breakdown))

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
        key = clip(request_id)
        entry = self._entries.get(key)
        if type(entry) is _Scheduled:
            entry = self._entries[key] = entry.entry()  # written once, in its place
        return entry  # type: ignore[return-value]

    def latest(self, limit: int) -> list[dict[str, Any]]:
        keys = list(self._entries)[-max(0, limit) :]  # limit <= 0: all of them
        keys.reverse()
        return [entry for key in keys if (entry := self.get(key)) is not None]


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
    fields = _request_fields(request)
    return _scheduled_entry(fields, result, candidates, seconds, breakdown, top)


def _scheduled_entry(
    fields: dict[str, Any],
    result: SchedulingResult,
    candidates: Sequence[Endpoint],
    seconds: float,
    breakdown: Mapping[str, Mapping[str, float]],
    top: int,
) -> dict[str, Any]:
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
        **fields,
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
