"""Runs scheduling profiles: filters → weighted, clamped scorers → picker.

The framework, not the plugins, owns what applies to every plugin (spec §5.3 step 10):
- each scorer's result is clamped to [0, 1] and multiplied by its configured weight; the weighted
  scores are summed (not normalised, as upstream); a scorer with the ``ListScorer`` capability
  (found when the scheduler is built) is asked for its scores as a list in candidate order, any
  other for its mapping by id, and both are summed the same way;
- a scorer that raises contributes 0 for this request and is counted;
- a filter that raises fails the request with a 500, a filter that empties the candidate list
  ends the profile with no result (the profile handler turns that into a 429);
- each plugin call is timed into ``plugin_duration_seconds`` (and, when the request is traced,
  each profile run and each plugin call over the threshold becomes a span).

``screen`` runs request control's screeners the same way, for the Director, before producers and
profiles: every screener is given the same candidates and the request keeps those every one kept
(in candidate order); none kept is a 503 (``rejected-no-endpoints``), a screener that raises a 500
(a screener is a constraint, so it fails closed).
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter
from typing import Any

from epp.observability.decisions import EXPLAIN_HEADER, EXPLAIN_KEY
from epp.observability.tracing import TRACE_KEY, RequestTrace
from epp.plugin import (
    CycleState,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    ListScorer,
    Profile,
    ProfileHandler,
    ProfileResult,
    SchedulingResult,
    ScoredCandidates,
    ScoredEndpoint,
    Scorer,
    Screener,
    TypedName,
)

log = logging.getLogger(__name__)

TRACED_TOP_SCORES = 5
"""Best candidates a traced ``pick_endpoints`` span names (upstream's maxTracedEndpointScores)."""

# (extension_point, plugin_type, plugin_name, seconds)
Observer = Callable[[str, str, str, float], None]
ErrorCounter = Callable[[str, str, str], None]
ScoreList = Callable[[CycleState, InferenceRequest, Sequence[Endpoint]], Sequence[float]]
_id = attrgetter("id")


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
        # The scorers that also return their scores as a list in candidate order (found once).
        self._listed: dict[int, ScoreList] = {
            id(scorer): scorer.score_list
            for profile in self._profiles.values()
            for scorer, _ in profile.scorers
            if isinstance(scorer, ListScorer)
        }

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

    def screen(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        screeners: Sequence[Screener],
    ) -> Sequence[Endpoint]:
        """The candidates every screener keeps, in candidate order (module docstring)."""
        given = tuple(candidates)  # a screener cannot change what the next one is given
        kept: set[str] | None = None
        for screener in screeners:
            name = screener.typed_name
            t0 = time.perf_counter()
            try:
                ids = {e.id for e in screener.screen(cycle, request, given)}
            except Exception as exc:
                self._count_error("Screener", name.type, name.name)
                log.exception("screener %s failed", name)
                raise InferenceError(ErrorCode.INTERNAL, f"screener {name} failed: {exc}") from exc
            finally:
                self._timed(cycle, "Screener", name, time.perf_counter() - t0)
            kept = ids if kept is None else kept & ids
        if kept is None:
            return candidates
        out = [e for e in given if e.id in kept]
        if not out:
            raise InferenceError(
                ErrorCode.SERVICE_UNAVAILABLE,
                "screeners eliminated all endpoint candidates",
                drop_reason=DropReason.NO_ENDPOINTS,
            )
        return out

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
    ) -> Scores:
        """One scorer's scores, timed: a list in candidate order from a ``ListScorer``, else its
        mapping by id. A scorer that raises, or whose list has another length than the
        candidates, contributes 0 (an empty mapping)."""
        listed = self._listed.get(id(scorer))
        t0 = time.perf_counter()
        scores: Scores
        try:
            if listed is None:
                scores = scorer.score(cycle, request, endpoints)
            else:
                scores = listed(cycle, request, endpoints)
                if len(scores) != len(endpoints):
                    raise ValueError(
                        f"score_list returned {len(scores)} scores for {len(endpoints)} endpoints"
                    )
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
    ) -> tuple[dict[str, float], list[float] | None]:
        """Each endpoint's weighted sum of clamped scores, keyed by id in candidate order; and
        the same sums as a list in candidate order when the ids are unique (else ``None``)."""
        ids: list[str] = list(map(_id, endpoints))
        results = [
            (str(scorer.typed_name), weight, self._scores_of(cycle, request, scorer, endpoints))
            for scorer, weight in profile.scorers
        ]
        breakdown: dict[str, dict[str, float]] | None = cycle.data.get("explain")
        if breakdown is None:
            sums = _weighted_sums(ids, results)
            totals = dict(zip(ids, sums, strict=True))
            if len(totals) == len(ids):  # ids unique (else: the per-id sums below)
                return totals, sums
        if breakdown is not None and len(set(ids)) == len(ids):
            sums = _sums_explained(ids, results, breakdown)
            return dict(zip(ids, sums, strict=True)), sums
        by_id = [(label, weight, _by_id(ids, scores)) for label, weight, scores in results]
        return _sums_by_id(ids, by_id, breakdown), None  # duplicate ids

    def run_profile(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: Profile,
        candidates: Sequence[Endpoint],
    ) -> ProfileResult | None:
        trace: RequestTrace | None = cycle.data.get(TRACE_KEY)
        if trace is not None and trace.recording:
            return self._run_traced(cycle, request, profile, candidates, trace)
        endpoints = self._filter(cycle, request, profile, candidates)
        if not endpoints:
            return None
        totals, sums = self._score(cycle, request, profile, endpoints)
        return self._pick(cycle, profile, endpoints, totals, sums)

    def _run_traced(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: Profile,
        candidates: Sequence[Endpoint],
        trace: RequestTrace,
    ) -> ProfileResult | None:
        """``run_profile`` with upstream's stage spans (``epp.observability.tracing``)."""
        about = _request_attributes(request)
        filtered = {"llm_d.epp.filter.candidate_endpoints": len(candidates), **about}
        trace.open_stage("filter_endpoints", filtered)
        endpoints = self._filter(cycle, request, profile, candidates)
        trace.close_stage(**{"llm_d.epp.filter.filtered_endpoints": len(endpoints)})
        if not endpoints:
            return None
        scoring = {
            "llm_d.epp.scorer.count": len(profile.scorers),
            "llm_d.epp.scoring.candidate_endpoints": len(endpoints),
            **about,
        }
        trace.open_stage("llm_d.epp.scoring", scoring)
        totals, sums = self._score(cycle, request, profile, endpoints)
        trace.close_stage()
        names, scores = top_scored(totals, TRACED_TOP_SCORES)
        picking: dict[str, Any] = {"llm_d.epp.picker.candidate_endpoints": len(endpoints)}
        if names:
            picking["llm_d.epp.picker.top_endpoints"] = names
            picking["llm_d.epp.picker.top_scores"] = scores
        trace.open_stage("pick_endpoints", {**picking, **about})
        result = self._pick(cycle, profile, endpoints, totals, sums)
        trace.close_stage()
        return result

    def _filter(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: Profile,
        candidates: Sequence[Endpoint],
    ) -> Sequence[Endpoint]:
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
                return endpoints
        return endpoints

    def _pick(
        self,
        cycle: CycleState,
        profile: Profile,
        endpoints: Sequence[Endpoint],
        totals: dict[str, float],
        sums: list[float] | None,
    ) -> ProfileResult | None:
        scored: Sequence[ScoredEndpoint]
        if sums is not None:  # ids unique: each ScoredEndpoint built only if the picker reads it
            scored = ScoredCandidates(endpoints, sums)
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


Scores = Mapping[str, float] | Sequence[float]
"""A scorer's scores: its mapping by id, or a ``ListScorer``'s list in candidate order."""

ScorerResult = tuple[str, float, Scores]
"""A scorer's label (``type/name``), its weight and its scores."""


def _weighted_sums(ids: list[str], results: list[ScorerResult]) -> list[float]:
    """Per candidate, in candidate order, the sum over scorers (in profile order) of the score
    clamped to [0, 1] (NaN → 0, missing → 0) times the weight: the same additions, in the same
    order, as ``_sums_by_id``, in one list pass per four scorers instead of a dict update per
    endpoint and scorer."""
    sums = [0.0] * len(ids)
    columns = [(weight, _in_order(ids, scores)) for _, weight, scores in results]
    for i in range(0, len(columns), 4):
        group = columns[i : i + 4]
        sums = _PASSES[len(group) - 1](sums, *group)
    return sums


Column = tuple[float, Iterable[float]]
"""A scorer's weight and its scores in candidate order."""


def _pass1(t: list[float], a: Column) -> list[float]:
    wa, va = a
    return [
        s + (1.0 if x > 1.0 else x if x >= 0.0 else 0.0) * wa for s, x in zip(t, va, strict=True)
    ]


def _pass2(t: list[float], a: Column, b: Column) -> list[float]:
    (wa, va), (wb, vb) = a, b
    return [
        s
        + (1.0 if x > 1.0 else x if x >= 0.0 else 0.0) * wa
        + (1.0 if y > 1.0 else y if y >= 0.0 else 0.0) * wb
        for s, x, y in zip(t, va, vb, strict=True)
    ]


def _pass3(t: list[float], a: Column, b: Column, c: Column) -> list[float]:
    (wa, va), (wb, vb), (wc, vc) = a, b, c
    return [
        s
        + (1.0 if x > 1.0 else x if x >= 0.0 else 0.0) * wa
        + (1.0 if y > 1.0 else y if y >= 0.0 else 0.0) * wb
        + (1.0 if z > 1.0 else z if z >= 0.0 else 0.0) * wc
        for s, x, y, z in zip(t, va, vb, vc, strict=True)
    ]


def _pass4(t: list[float], a: Column, b: Column, c: Column, d: Column) -> list[float]:
    # ((((s + xa) + yb) + zc) + wd): the additions of four one-scorer passes, in one pass
    (wa, va), (wb, vb), (wc, vc), (wd, vd) = a, b, c, d
    return [
        s
        + (1.0 if x > 1.0 else x if x >= 0.0 else 0.0) * wa
        + (1.0 if y > 1.0 else y if y >= 0.0 else 0.0) * wb
        + (1.0 if z > 1.0 else z if z >= 0.0 else 0.0) * wc
        + (1.0 if u > 1.0 else u if u >= 0.0 else 0.0) * wd
        for s, x, y, z, u in zip(t, va, vb, vc, vd, strict=True)
    ]


_PASSES: tuple[Callable[..., list[float]], ...] = (_pass1, _pass2, _pass3, _pass4)


def _in_order(ids: list[str], scores: Scores) -> Iterable[float]:
    """The scores in candidate order, 0 for a candidate the scorer left out."""
    if type(scores) is list:
        return scores  # a ListScorer's list: in candidate order already
    if type(scores) is dict:
        if len(scores) == len(ids) and list(scores) == ids:
            return scores.values()  # keyed in candidate order: no lookups
        return map(scores.get, ids, repeat(0.0))
    if isinstance(scores, Mapping):
        return map(scores.get, ids, repeat(0.0))
    return scores  # a ListScorer's list: in candidate order already


def _sums_explained(
    ids: list[str], results: list[ScorerResult], breakdown: dict[str, dict[str, float]]
) -> list[float]:
    """``_sums_by_id`` by position, for unique ids: the same sums, in candidate order, and the
    same explain breakdown (each candidate's clamped score per scorer label)."""
    rows = [breakdown.setdefault(eid, {}) for eid in ids]
    sums = [0.0] * len(ids)
    for label, weight, scores in results:
        for k, s in enumerate(_in_order(ids, scores)):
            if s > 1.0:
                s = 1.0
            elif not s >= 0.0:  # negative or NaN
                s = 0.0
            sums[k] += s * weight
            rows[k][label] = s
    return sums


def _by_id(ids: list[str], scores: Scores) -> Mapping[str, float]:
    """The scores keyed by id (a ``ListScorer``'s list zipped with the candidates' ids)."""
    if isinstance(scores, Mapping):
        return scores
    return dict(zip(ids, scores, strict=True))


def _sums_by_id(
    ids: list[str],
    results: list[tuple[str, float, Mapping[str, float]]],
    breakdown: dict[str, dict[str, float]] | None,
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


def top_scored(totals: Mapping[str, float], limit: int) -> tuple[list[str], list[float]]:
    """The ``limit`` best endpoint ids with their weighted scores, best first, ties by id."""
    best = heapq.nsmallest(limit, totals.items(), key=lambda kv: (-kv[1], kv[0]))
    return [eid for eid, _ in best], [score for _, score in best]


def _request_attributes(request: InferenceRequest) -> dict[str, str]:
    """``gen_ai.request.model`` (when set) and ``gen_ai.request.id``, as upstream's stage spans."""
    out = {"gen_ai.request.model": request.target_model} if request.target_model else {}
    if request.request_id:
        out["gen_ai.request.id"] = request.request_id
    return out
