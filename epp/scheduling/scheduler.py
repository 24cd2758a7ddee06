"""Runs scheduling profiles: filters → weighted, clamped scorers → picker.

The framework, not the plugins, owns what applies to every plugin (spec §5.3 step 10):
- each scorer's result is clamped to [0, 1] and multiplied by its configured weight; the weighted
  scores are summed (not normalised, as upstream);
- a scorer that raises contributes 0 for this request and is counted;
- a filter that raises fails the request with a 500, a filter that empties the candidate list
  ends the profile with no result (the profile handler turns that into a 429);
- each plugin call is timed into ``plugin_duration_seconds`` (and, when the request is traced,
  each profile run and each plugin call over the threshold becomes a span).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat

from epp.observability.decisions import EXPLAIN_HEADER, EXPLAIN_KEY
from epp.observability.tracing import TRACE_KEY, RequestTrace
from epp.plugin import (
    CycleState,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Profile,
    ProfileHandler,
    ProfileResult,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
    TypedName,
)

log = logging.getLogger(__name__)

# (extension_point, plugin_type, plugin_name, seconds)
Observer = Callable[[str, str, str, float], None]
ErrorCounter = Callable[[str, str, str], None]


class Scheduler:
    def __init__(
        self,
        *,
        profiles: Mapping[str, Profile],
        handler: ProfileHandler,
        observe: Observer,
        count_error: ErrorCounter,
        breakdown_limit: int = 64,
    ) -> None:
        self._breakdown_limit = breakdown_limit
        self._profiles = dict(profiles)
        self._handler = handler
        self._observe = observe
        self._count_error = count_error

    def schedule(
        self, cycle: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> SchedulingResult:
        results: dict[str, ProfileResult | None] = {}
        if (
            len(candidates) <= self._breakdown_limit
            or request.headers.get(EXPLAIN_HEADER) == "true"
        ):
            # Per-scorer scores for the explain view (bounded cost: few candidates, or asked for).
            cycle.data["explain"] = request.attributes[EXPLAIN_KEY] = {}
        for _ in range(len(self._profiles) + 1):  # a handler never needs more rounds than profiles
            chosen = self._handler.pick_profiles(cycle, request, self._profiles, results)
            if not chosen:
                break
            trace: RequestTrace | None = cycle.data.get(TRACE_KEY)
            for name, profile in chosen.items():
                if trace is not None:
                    trace.open_profile(name)
                results[name] = self.run_profile(cycle, request, profile, candidates)
                if trace is not None:
                    trace.close_profile()
        if not results:
            raise InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED, "failed to find target endpoint: no profile ran"
            )
        return self._handler.process_results(cycle, request, results)

    def _timed(self, cycle: CycleState, point: str, name: TypedName, seconds: float) -> None:
        """A plugin call ended: its duration metric, and its span when the request is traced."""
        self._observe(point, name.type, name.name, seconds)
        trace: RequestTrace | None = cycle.data.get(TRACE_KEY)
        if trace is not None:
            trace.plugin(point, name, seconds)

    def _scores_of(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        scorer: Scorer,
        endpoints: Sequence[Endpoint],
    ) -> Mapping[str, float]:
        """One scorer's scores, timed; a scorer that raises contributes 0 (an empty mapping)."""
        t0 = time.perf_counter()
        try:
            scores = scorer.score(cycle, request, endpoints)
        except Exception:
            self._count_error("Scorer", scorer.typed_name.type, scorer.typed_name.name)
            log.exception("scorer %s failed; it contributes 0", scorer.typed_name)
            scores = {}
        self._timed(cycle, "Scorer", scorer.typed_name, time.perf_counter() - t0)
        return scores

    def _score(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: Profile,
        endpoints: Sequence[Endpoint],
    ) -> dict[str, float]:
        """Each endpoint's weighted sum of clamped scores, keyed by id in candidate order."""
        ids = [e.id for e in endpoints]
        results = [
            (str(scorer.typed_name), weight, self._scores_of(cycle, request, scorer, endpoints))
            for scorer, weight in profile.scorers
        ]
        breakdown: dict[str, dict[str, float]] | None = cycle.data.get("explain")
        if breakdown is None:
            totals = dict(zip(ids, _weighted_sums(ids, results), strict=True))
            if len(totals) == len(ids):  # ids unique (else: the per-id sums below)
                return totals
        return _sums_by_id(ids, results, breakdown)

    def run_profile(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: Profile,
        candidates: Sequence[Endpoint],
    ) -> ProfileResult | None:
        endpoints = candidates
        for flt in profile.filters:
            t0 = time.perf_counter()
            try:
                endpoints = flt.filter(cycle, request, endpoints)
            except Exception as exc:
                self._count_error("Filter", flt.typed_name.type, flt.typed_name.name)
                log.exception("filter %s failed", flt.typed_name)
                raise InferenceError(
                    ErrorCode.INTERNAL, f"filter {flt.typed_name} failed: {exc}"
                ) from exc
            finally:
                self._timed(cycle, "Filter", flt.typed_name, time.perf_counter() - t0)
            if not endpoints:
                return None
        totals = self._score(cycle, request, profile, endpoints)
        if len(totals) == len(endpoints):  # ids unique: totals are in candidate order
            # ScoredEndpoint(e, total) for each candidate, built in C
            scored = list(
                map(
                    tuple.__new__,
                    repeat(ScoredEndpoint),
                    zip(endpoints, totals.values(), strict=True),
                )
            )
        else:
            scored = [ScoredEndpoint(e, totals[e.id]) for e in endpoints]
        picker = profile.picker
        t0 = time.perf_counter()
        pick = picker.pick(cycle, scored)
        elapsed = time.perf_counter() - t0
        self._timed(cycle, "Picker", picker.typed_name, elapsed)
        if not pick.targets:
            return None
        return ProfileResult(targets=pick.targets, scores=totals)


ScorerResult = tuple[str, float, Mapping[str, float]]
"""A scorer's label (``type/name``), its weight and its scores."""


def _weighted_sums(ids: list[str], results: list[ScorerResult]) -> list[float]:
    """Per candidate, in candidate order, the sum over scorers (in profile order) of the score
    clamped to [0, 1] (NaN → 0, missing → 0) times the weight: the same additions, in the same
    order, as ``_sums_by_id``, in one list pass per two scorers instead of a dict update per
    endpoint and scorer."""
    n = len(ids)
    sums = [0.0] * n
    columns = [(weight, _in_order(ids, scores)) for _, weight, scores in results]
    for i in range(0, len(columns) - 1, 2):
        (wa, va), (wb, vb) = columns[i], columns[i + 1]
        sums = [
            (t + (1.0 if a > 1.0 else a if a >= 0.0 else 0.0) * wa)
            + (1.0 if b > 1.0 else b if b >= 0.0 else 0.0) * wb
            for t, a, b in zip(sums, va, vb, strict=True)
        ]
    if len(columns) % 2:
        w, v = columns[-1]
        sums = [
            t + (1.0 if s > 1.0 else s if s >= 0.0 else 0.0) * w
            for t, s in zip(sums, v, strict=True)
        ]
    return sums


def _in_order(ids: list[str], scores: Mapping[str, float]) -> Iterable[float]:
    """The scores in candidate order, 0 for a candidate the scorer left out."""
    if type(scores) is dict and len(scores) == len(ids) and list(scores) == ids:
        return scores.values()  # keyed in candidate order (the usual case): no lookups
    return map(scores.get, ids, repeat(0.0))


def _sums_by_id(
    ids: list[str], results: list[ScorerResult], breakdown: dict[str, dict[str, float]] | None
) -> dict[str, float]:
    """The weighted sums keyed by id, recording each clamped score in the explain breakdown."""
    totals = dict.fromkeys(ids, 0.0)
    for label, weight, scores in results:
        get = scores.get
        for eid in totals:  # each id once, even when two candidates share it
            s = get(eid, 0.0)
            if s > 1.0:
                s = 1.0
            elif not s >= 0.0:  # negative or NaN
                s = 0.0
            totals[eid] += s * weight
            if breakdown is not None:
                breakdown.setdefault(eid, {})[label] = s
    return totals
