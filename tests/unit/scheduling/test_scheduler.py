"""The scheduler loop (``epp.scheduling.scheduler``) with hand-written plugins: exact totals
(clamped scores times weights), which endpoint is picked, what a failing scorer or filter does,
how many profile rounds a handler gets, the explain breakdown and what is timed."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from epp.observability.decisions import EXPLAIN_HEADER, EXPLAIN_KEY
from epp.observability.tracing import TRACE_KEY
from epp.plugin import (
    CycleState,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PickResult,
    Profile,
    ProfileResult,
    SchedulingResult,
    ScoredEndpoint,
    TypedName,
)
from epp.scheduling.scheduler import Scheduler
from tests.builders import make_cycle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(3)]
IDS = [e.id for e in EPS]


class Scorer:
    def __init__(self, name: str, scores: Mapping[str, float] | Exception) -> None:
        self.typed_name = TypedName("test-scorer", name)
        self.scores = scores
        self.calls = 0

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        self.calls += 1
        if isinstance(self.scores, Exception):
            raise self.scores
        return self.scores


class Filter:
    def __init__(self, name: str, keep: Callable[[Endpoint], bool] | Exception) -> None:
        self.typed_name = TypedName("test-filter", name)
        self.keep = keep

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if isinstance(self.keep, Exception):
            raise self.keep
        keep = self.keep
        return [e for e in endpoints if keep(e)]


class Picker:
    """Picks the highest score (first on ties), or nothing when ``empty``; remembers its input."""

    def __init__(self, empty: bool = False) -> None:
        self.typed_name = TypedName("test-picker", "p")
        self.empty = empty
        self.seen: list[ScoredEndpoint] = []

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        self.seen = list(scored)
        self.cycle = cycle
        if self.empty:
            return PickResult(targets=())
        best = max(scored, key=lambda s: s.score)
        return PickResult(targets=(best.endpoint,), scored=tuple(scored))


class Handler:
    """Runs ``rounds`` (each a tuple of profile names) in turn, then stops; records results."""

    def __init__(self, rounds: Sequence[Sequence[str]], forever: bool = False) -> None:
        self.typed_name = TypedName("test-handler", "h")
        self.rounds = list(rounds)
        self.forever = forever
        self.calls = 0
        self.results: dict[str, ProfileResult | None] = {}

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]:
        self.calls += 1
        self.seen = (cycle, request)
        if self.forever:
            return dict(profiles)
        if not self.rounds:
            return {}
        return {n: profiles[n] for n in self.rounds.pop(0)}

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        self.results = dict(results)
        return SchedulingResult(profile_results=dict(results), primary_profile=next(iter(results)))


class Trace:
    recording = True

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.seconds: list[float] = []
        self.stages: list[tuple[str, dict[str, Any]]] = []

    def open_stage(self, name: str, attributes: dict[str, Any]) -> None:
        self.events.append(("stage", name))
        self.stages.append((name, attributes))

    def close_stage(self, **attributes: Any) -> None:
        self.events.append(("end",))
        self.stages[-1][1].update(attributes)

    def open_profile(self, name: str) -> None:
        self.events.append(("open", name))

    def close_profile(self) -> None:
        self.events.append(("close",))

    def plugin(self, point: str, typed_name: TypedName, seconds: float) -> None:
        self.events.append(("plugin", point, typed_name.type, typed_name.name))
        self.seconds.append(seconds)


class World:
    def __init__(self, profiles: Mapping[str, Profile], handler: Handler, limit: int = 64) -> None:
        self.observed: list[tuple[str, str, str]] = []
        self.seconds: list[float] = []
        self.errors: list[tuple[str, str, str]] = []
        self.scheduler = Scheduler(
            profiles=profiles,
            handler=handler,
            observe=self._observe,
            count_error=lambda *a: self.errors.append(a),
            breakdown_limit=limit,
        )

    def _observe(self, point: str, type_: str, name: str, seconds: float) -> None:
        self.observed.append((point, type_, name))
        self.seconds.append(seconds)


def _profile(
    scorers: Sequence[tuple[Scorer, float]] = (),
    filters: Sequence[Filter] = (),
    picker: Picker | None = None,
    name: str = "default",
) -> Profile:
    return Profile(name, tuple(filters), tuple(scorers), picker or Picker())


def _run(
    profile: Profile,
    candidates: Sequence[Endpoint] = EPS,
    request: InferenceRequest | None = None,
    cycle: CycleState | None = None,
    limit: int = 64,
) -> tuple[World, SchedulingResult, Handler]:
    handler = Handler([["default"]])
    world = World({"default": profile}, handler, limit)
    result = world.scheduler.schedule(cycle or make_cycle(), request or make_request(), candidates)
    return world, result, handler


def _totals(result: SchedulingResult) -> dict[str, float]:
    pr = result.profile_results["default"]
    assert pr is not None
    return dict(pr.scores)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_totals_are_clamped_scores_times_weights(n: int) -> None:
    rows: list[tuple[Scorer, float]] = [
        (Scorer("a", {IDS[0]: 0.5, IDS[1]: 2.0, IDS[2]: -1.0}), 2.0),
        (Scorer("b", {IDS[0]: math.nan, IDS[2]: 0.25}), 1.0),  # IDS[1] left out
        (Scorer("c", {IDS[2]: 1.0, IDS[1]: 0.0, IDS[0]: 1.0}), 0.5),  # not in candidate order
        (Scorer("d", {IDS[0]: 0.75, IDS[1]: 0.5, IDS[2]: math.inf}), 3.0),
    ][:n]
    expected = {
        1: [1.0, 2.0, 0.0],
        2: [1.0, 2.0, 0.25],
        3: [1.5, 2.0, 0.75],
        4: [3.75, 3.5, 3.75],
    }[n]
    for limit in (64, 0):  # with and without the explain breakdown
        _, result, _ = _run(_profile(rows), limit=limit)
        assert _totals(result) == dict(zip(IDS, expected, strict=True))


def test_the_highest_total_is_picked_and_the_picker_sees_every_candidate() -> None:
    picker = Picker()
    scorer = Scorer("s", {IDS[0]: 0.1, IDS[1]: 0.9, IDS[2]: 0.4})
    _, result, handler = _run(_profile([(scorer, 1.0)], picker=picker))
    assert result.primary_profile == "default"
    assert handler.results["default"] == ProfileResult(
        targets=(EPS[1],), scores={IDS[0]: 0.1, IDS[1]: 0.9, IDS[2]: 0.4}
    )
    assert picker.seen == [
        ScoredEndpoint(EPS[0], 0.1),
        ScoredEndpoint(EPS[1], 0.9),
        ScoredEndpoint(EPS[2], 0.4),
    ]
    assert all(type(s) is ScoredEndpoint for s in picker.seen)


def test_no_scorers_score_every_candidate_zero() -> None:
    _, result, _ = _run(_profile())
    assert _totals(result) == dict.fromkeys(IDS, 0.0)


def test_duplicate_ids_share_one_total() -> None:
    twin = dataclasses.replace(EPS[0], address="10.0.0.9")
    picker = Picker()
    scorer = Scorer("s", {IDS[0]: 0.5, IDS[1]: 0.25})
    _, result, _ = _run(_profile([(scorer, 2.0)], picker=picker), [EPS[0], EPS[1], twin], limit=0)
    assert _totals(result) == {IDS[0]: 1.0, IDS[1]: 0.5}
    assert picker.seen == [
        ScoredEndpoint(EPS[0], 1.0),
        ScoredEndpoint(EPS[1], 0.5),
        ScoredEndpoint(twin, 1.0),
    ]


def test_a_failing_scorer_contributes_zero_and_is_counted(caplog: Any) -> None:
    bad = Scorer("bad", RuntimeError("boom"))
    good = Scorer("good", {IDS[0]: 0.2, IDS[1]: 0.6, IDS[2]: 0.4})
    with caplog.at_level(logging.ERROR, "epp.scheduling.scheduler"):
        world, result, _ = _run(_profile([(bad, 5.0), (good, 1.0)]))
    assert _totals(result) == {IDS[0]: 0.2, IDS[1]: 0.6, IDS[2]: 0.4}
    assert world.errors == [("Scorer", "test-scorer", "bad")]
    assert [r.getMessage() for r in caplog.records] == [
        "scorer bad/test-scorer failed; it contributes 0"
    ]


def test_a_failing_filter_fails_the_request_with_a_500(caplog: Any) -> None:
    flt = Filter("f", ValueError("no labels"))
    with (
        caplog.at_level(logging.ERROR, "epp.scheduling.scheduler"),
        pytest.raises(InferenceError) as info,
    ):
        _run(_profile(filters=[flt]))
    assert info.value.code is ErrorCode.INTERNAL
    assert info.value.message == "filter f/test-filter failed: no labels"
    assert isinstance(info.value.__cause__, ValueError)
    assert [r.getMessage() for r in caplog.records] == ["filter f/test-filter failed"]


def test_a_failing_filter_is_counted_and_timed() -> None:
    handler = Handler([["default"]])
    world = World({"default": _profile(filters=[Filter("f", KeyError("k"))])}, handler)
    with pytest.raises(InferenceError):
        world.scheduler.schedule(make_cycle(), make_request(), EPS)
    assert world.errors == [("Filter", "test-filter", "f")]
    assert world.observed == [("Filter", "test-filter", "f")]


def test_filters_narrow_in_order_and_an_empty_result_ends_the_profile() -> None:
    scorer = Scorer("s", {IDS[0]: 1.0, IDS[1]: 0.5, IDS[2]: 0.2})
    picker = Picker()
    not_first = Filter("a", lambda e: e.id != IDS[0])
    not_second = Filter("b", lambda e: e.id != IDS[1])
    world, result, _ = _run(_profile([(scorer, 1.0)], [not_first, not_second], picker))
    assert [s.endpoint for s in picker.seen] == [EPS[2]]
    assert _totals(result) == {IDS[2]: 0.2}
    assert world.observed == [
        ("Filter", "test-filter", "a"),
        ("Filter", "test-filter", "b"),
        ("Scorer", "test-scorer", "s"),
        ("Picker", "test-picker", "p"),
    ]
    assert all(s >= 0 for s in world.seconds)

    nothing = Filter("none", lambda e: False)
    world, result, handler = _run(_profile([(scorer, 1.0)], [nothing, not_first]))
    assert handler.results == {"default": None}
    assert world.observed == [("Filter", "test-filter", "none")]


def test_a_picker_that_picks_nothing_gives_no_result() -> None:
    _, _, handler = _run(_profile(picker=Picker(empty=True)))
    assert handler.results == {"default": None}


def test_profiles_run_in_the_rounds_the_handler_asks_for() -> None:
    a = _profile([(Scorer("a", {IDS[0]: 1.0}), 1.0)], name="a")
    b = _profile([(Scorer("b", {IDS[1]: 1.0}), 1.0)], name="b")
    handler = Handler([["a"], ["b"]])
    result = World({"a": a, "b": b}, handler).scheduler.schedule(make_cycle(), make_request(), EPS)
    assert handler.calls == 3  # a, then b, then "no more"
    pa, pb = result.profile_results["a"], result.profile_results["b"]
    assert pa is not None and pa.targets == (EPS[0],)
    assert pb is not None and pb.targets == (EPS[1],)


@pytest.mark.parametrize("profiles", [1, 2])
def test_a_handler_gets_one_round_more_than_there_are_profiles(profiles: int) -> None:
    scorers = {n: Scorer(n, {}) for n in "ab"[:profiles]}
    prof = {n: _profile([(s, 1.0)], name=n) for n, s in scorers.items()}
    handler = Handler([], forever=True)
    World(prof, handler).scheduler.schedule(make_cycle(), make_request(), EPS)
    assert handler.calls == profiles + 1
    assert [s.calls for s in scorers.values()] == [profiles + 1] * profiles


def test_no_profile_ran_is_resource_exhausted() -> None:
    handler = Handler([])
    with pytest.raises(InferenceError) as info:
        World({"default": _profile()}, handler).scheduler.schedule(
            make_cycle(), make_request(), EPS
        )
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.message == "failed to find target endpoint: no profile ran"


def test_the_explain_breakdown_holds_each_clamped_score_by_scorer() -> None:
    s1 = Scorer("one", {IDS[0]: 1.5, IDS[1]: -0.5})
    s2 = Scorer("two", {IDS[1]: 0.25})
    request = make_request()
    cycle = make_cycle()
    _run(_profile([(s1, 2.0), (s2, 1.0)]), request=request, cycle=cycle, limit=3)
    expected = {
        IDS[0]: {"one/test-scorer": 1.0, "two/test-scorer": 0.0},
        IDS[1]: {"one/test-scorer": 0.0, "two/test-scorer": 0.25},
        IDS[2]: {"one/test-scorer": 0.0, "two/test-scorer": 0.0},
    }
    assert request.attributes[EXPLAIN_KEY] == expected
    assert cycle.data["explain"] is request.attributes[EXPLAIN_KEY]


def test_the_breakdown_is_skipped_for_large_pools_unless_asked() -> None:
    scorer = Scorer("s", {IDS[0]: 0.5})
    for limit, headers, wanted in (
        (2, {}, False),
        (3, {}, True),
        (2, {EXPLAIN_HEADER: "true"}, True),
        (2, {EXPLAIN_HEADER: "yes"}, False),
    ):
        request = make_request(headers=headers)
        cycle = make_cycle()
        _, result, _ = _run(_profile([(scorer, 1.0)]), request=request, cycle=cycle, limit=limit)
        assert (EXPLAIN_KEY in request.attributes) is wanted
        assert ("explain" in cycle.data) is wanted
        assert _totals(result) == {IDS[0]: 0.5, IDS[1]: 0.0, IDS[2]: 0.0}


def test_a_traced_request_records_profiles_and_plugin_calls() -> None:
    trace = Trace()
    cycle = make_cycle()
    cycle.data[TRACE_KEY] = trace
    flt = Filter("f", lambda e: True)
    _run(_profile([(Scorer("s", {}), 1.0)], [flt]), cycle=cycle)
    assert trace.events == [
        ("open", "default"),
        ("stage", "filter_endpoints"),
        ("plugin", "Filter", "test-filter", "f"),
        ("end",),
        ("stage", "llm_d.epp.scoring"),
        ("plugin", "Scorer", "test-scorer", "s"),
        ("end",),
        ("stage", "pick_endpoints"),
        ("plugin", "Picker", "test-picker", "p"),
        ("end",),
        ("close",),
    ]


def test_traced_stages_carry_upstreams_counts_and_the_best_scores() -> None:
    trace = Trace()
    cycle = make_cycle()
    cycle.data[TRACE_KEY] = trace
    scores = {EPS[0].id: 0.2, EPS[1].id: 0.9, EPS[2].id: 0.5}
    flt = Filter("f", lambda e: True)
    _run(_profile([(Scorer("s", scores), 2.0)], [flt]), cycle=cycle)
    stages = dict(trace.stages)
    assert stages["filter_endpoints"]["llm_d.epp.filter.candidate_endpoints"] == len(EPS)
    assert stages["filter_endpoints"]["llm_d.epp.filter.filtered_endpoints"] == len(EPS)
    assert stages["llm_d.epp.scoring"]["llm_d.epp.scorer.count"] == 1
    assert stages["llm_d.epp.scoring"]["llm_d.epp.scoring.candidate_endpoints"] == len(EPS)
    pick = stages["pick_endpoints"]
    assert pick["llm_d.epp.picker.top_endpoints"] == [EPS[1].id, EPS[2].id, EPS[0].id]
    assert pick["llm_d.epp.picker.top_scores"] == [1.8, 1.0, 0.4]
    assert pick["gen_ai.request.id"] == "req-0"


class _Ticks:
    """A perf_counter that advances one second per reading."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_each_plugin_call_is_timed_by_its_own_duration(monkeypatch: pytest.MonkeyPatch) -> None:
    import epp.scheduling.scheduler as mod

    monkeypatch.setattr(mod, "time", _Ticks())
    flt = Filter("f", lambda e: True)
    trace, cycle = Trace(), make_cycle()
    cycle.data[TRACE_KEY] = trace
    profile = _profile([(Scorer("s", {}), 1.0), (Scorer("t", {}), 1.0)], [flt])
    world, _, _ = _run(profile, cycle=cycle)
    assert trace.seconds == [1.0, 1.0, 1.0, 1.0]
    assert world.observed == [
        ("Filter", "test-filter", "f"),
        ("Scorer", "test-scorer", "s"),
        ("Scorer", "test-scorer", "t"),
        ("Picker", "test-picker", "p"),
    ]
    assert world.seconds == [1.0, 1.0, 1.0, 1.0]


def test_scorers_and_filters_see_the_cycle() -> None:
    class ByCycle(Scorer):
        def score(
            self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
        ) -> Mapping[str, float]:
            return {e.id: cycle.data["boost"] * request.attributes["factor"] for e in endpoints}

    class CycleFilter(Filter):
        def filter(
            self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
        ) -> Sequence[Endpoint]:
            return [e for e in endpoints if e.id in cycle.data["keep"] | request.attributes["also"]]

    cycle = make_cycle()
    cycle.data.update(boost=0.5, keep={IDS[1]})
    request = make_request(attributes={"factor": 2.0, "also": {IDS[2]}})
    picker = Picker()
    profile = _profile([(ByCycle("c", {}), 2.0)], [CycleFilter("k", lambda e: True)], picker)
    _, result, handler = _run(profile, cycle=cycle, request=request)
    assert _totals(result) == {IDS[1]: 2.0, IDS[2]: 2.0}
    assert picker.cycle is cycle
    assert handler.seen == (cycle, request)
