"""The Director's request side and response bookkeeping (``epp.requestcontrol.director``), with a
real scheduler and parser and hand-written plugins: request identity and fairness, candidates and
the subset hint, legacy shedding, producers, admitters and hooks, the destination, errors, held
and streamed responses, completion exactly once."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from epp.plugin import (
    CycleState,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PickResult,
    Profile,
    ResponseInfo,
    SchedulingResult,
    ScoredEndpoint,
    TerminationCause,
    TypedName,
    wire,
)
from epp.plugin.params import decode
from epp.plugin.session import AGENT_IDENTITY
from epp.plugins.parsers.openai import OpenAIParser
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Forward
from epp.requestcontrol.objectives import ObjectiveStore
from epp.scheduling.scheduler import Scheduler
from tests.builders import FakeHandle, make_endpoint

EPS = [make_endpoint(i) for i in range(3)]  # 192.168.1.1-3:8000
BODY = json.dumps({"model": "m", "prompt": "hi"}).encode()
HEADERS = {":path": "/v1/completions", "content-type": "application/json"}
log_name = "epp.requestcontrol.director"


class Named:
    def __init__(self, kind: str, name: str = "x") -> None:
        self.typed_name = TypedName(kind, name)


class Highest(Named):
    """Scores by position: the last candidate scores highest."""

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> dict[str, float]:
        return {e.id: (i + 1) / len(endpoints) for i, e in enumerate(endpoints)}


class Best(Named):
    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        return PickResult(targets=(max(scored, key=lambda s: s.score).endpoint,))


class One(Named):
    def pick_profiles(self, cycle: Any, request: Any, profiles: Any, results: Any) -> Any:
        return {} if results else dict(profiles)

    def process_results(self, cycle: Any, request: Any, results: Any) -> SchedulingResult:
        return SchedulingResult(profile_results=dict(results), primary_profile="p")


class Journal:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


class Hook(Named):
    def __init__(self, journal: Journal, name: str, fail: bool = False) -> None:
        super().__init__("hook", name)
        self.journal, self.fail = journal, fail

    def _note(self, *what: Any) -> None:
        self.journal.calls.append((self.typed_name.name, *what))
        if self.fail:
            raise RuntimeError("hook broke")

    def request_header(self, request: InferenceRequest) -> None:
        self._note("header")
        request.attributes[AGENT_IDENTITY] = f"agent-{self.typed_name.name}"

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self._note("pre", result.primary.targets[0].address)

    def admit(self, cycle: CycleState, request: InferenceRequest, pool: Any) -> Any:
        self.journal.calls.append((self.typed_name.name, "admit", len(pool)))
        return InferenceError(ErrorCode.FORBIDDEN, "denied") if self.fail else None

    def response_headers(self, request: Any, response: ResponseInfo, out: dict[str, str]) -> None:
        out["x-hook"] = self.typed_name.name
        self._note("headers", response.status)

    def response_complete(self, request: Any, response: ResponseInfo) -> None:
        self._note("complete", response.termination_cause)

    async def produce(self, request: InferenceRequest, pool: Sequence[Endpoint]) -> None:
        self.journal.calls.append((self.typed_name.name, "produce"))
        if self.fail:
            await asyncio.Event().wait()  # never returns: the timeout ends it
        request.attributes["produced"] = len(pool)


class Detector(Named):
    def __init__(self, saturation: float) -> None:
        super().__init__("detector")
        self.value = saturation

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float:
        return self.value


class Narrower(Detector):
    def routable(self, now: float, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        self.seen = (now, list(endpoints))
        return list(endpoints)[1:]


class Stats:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def serve_models_from(self, fn: Any) -> None:
        self.calls.append(("serve",))

    def __getattr__(self, name: str) -> Any:
        return lambda *a: self.calls.append((name, *a))


def pipeline(**kw: Any) -> Any:
    parser = OpenAIParser(name="p", params=decode(OpenAIParser.Params, {}), handle=FakeHandle())
    base: dict[str, Any] = dict(
        parsers=[parser],
        producers=[],
        producer_timeouts=[],
        screeners=[],
        request_header=[],
        response_headers=[],
        response_streaming=[],
        response_complete=[],
        pre_request=[],
        admitters=[],
        saturation_detector=Detector(0.0),
    )
    base.update(kw)
    return SimpleNamespace(**base)


def director(
    pipe: Any = None,
    endpoints: Sequence[Endpoint] = EPS,
    objectives: ObjectiveStore | None = None,
    **kw: Any,
) -> Director:
    profile = Profile("p", (), ((Highest("scorer"), 1.0),), Best("picker"))
    scheduler = Scheduler(
        profiles={"p": profile},
        handler=One("handler"),
        observe=lambda *a: None,
        count_error=lambda *a: None,
    )
    return Director(
        pipeline=pipe if pipe is not None else pipeline(),
        scheduler=scheduler,
        endpoints=lambda: list(endpoints),
        objectives=objectives or ObjectiveStore(),
        clock=lambda: 42.0,
        rng=random.Random(1),
        **kw,
    )


def hint(*entries: str) -> dict[str, Any]:
    return {wire.SUBSET_NAMESPACE: {wire.SUBSET_KEY: list(entries)}}


# ---- identity, objective, fairness ------------------------------------------------------------


def test_a_new_request_takes_its_id_objective_and_fairness_from_headers() -> None:
    objectives = ObjectiveStore()
    objectives.replace({"batch": -1})
    d = director(objectives=objectives)
    r = d.new_request(
        {
            "x-request-id": "abc",
            "x-gateway-inference-fairness-id": "tenant-b",
            "x-gateway-inference-objective": "batch",
        }
    )
    assert (r.request_id, r.objective, r.priority, r.fairness_id) == (
        "abc",
        "batch",
        -1,
        "tenant-b",
    )
    assert r.received_at == 42.0
    r2 = d.new_request({})
    assert r2.fairness_id == "default-flow" and r2.priority == 0 and r2.objective == ""
    assert len(r2.request_id) == 36 and r2.request_id != d.new_request({}).request_id


def test_header_processors_run_and_publish_the_fairness_id(caplog: Any) -> None:
    journal = Journal()
    broken, good = Hook(journal, "broken", fail=True), Hook(journal, "good")
    d = director(pipeline(request_header=[broken, good]))
    with caplog.at_level(logging.ERROR, log_name):
        r = d.new_request({})
    assert journal.calls == [("broken", "header"), ("good", "header")]
    assert r.fairness_id == "agent-good"
    assert [rec.getMessage() for rec in caplog.records] == ["request-header processor failed"]
    r = d.new_request({"x-llm-d-inference-fairness-id": "given"})
    assert r.fairness_id == "given"


def test_without_an_agent_identity_the_flow_is_the_default() -> None:
    class Silent(Named):
        def request_header(self, request: InferenceRequest) -> None:
            request.attributes[AGENT_IDENTITY] = 7  # not a string: no identity

    assert director(pipeline(request_header=[Silent("s")])).new_request({}).fairness_id == (
        "default-flow"
    )


# ---- candidates -------------------------------------------------------------------------------


def test_the_subset_hint_keeps_matching_ips() -> None:
    d = director()
    assert d.candidates(hint("192.168.1.2:8000", "192.168.1.3")) == EPS[1:]
    assert d.candidates({}) == EPS
    assert d.candidates(hint()) == []
    assert director(subset_filter=False).candidates(hint("192.168.1.2:8000")) == EPS


def test_a_narrowing_detector_sees_the_clock_and_the_pool() -> None:
    narrower = Narrower(0.0)
    d = director(pipeline(saturation_detector=narrower))
    assert d.candidates(hint("192.168.1.1", "192.168.1.3")) == [EPS[2]]
    assert narrower.seen == (42.0, [EPS[0], EPS[2]])
    del narrower.seen
    assert d.candidates(hint()) == []
    assert not hasattr(narrower, "seen")  # an empty pool is not narrowed


def test_pick_random_honours_the_hint_and_names_an_empty_pool() -> None:
    d = director()
    assert d.pick_random(hint("192.168.1.2")) == EPS[1]
    assert d.pick_random({}) in EPS
    with pytest.raises(InferenceError) as info:
        d.pick_random(hint("10.0.0.1"))
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert info.value.message == "failed to find endpoint candidates for serving the request"
    with pytest.raises(InferenceError) as info:
        director(endpoints=[]).pick_random({})
    assert info.value.code is ErrorCode.INTERNAL
    assert info.value.message == "no pods available in datastore"


# ---- deciding ---------------------------------------------------------------------------------


async def test_route_decides_records_and_reports_the_destination() -> None:
    stats, seconds = Stats(), []
    d = director(stats=stats, on_scheduled=seconds.append)
    ex = d.begin({**HEADERS, "x-request-id": "r1"})
    decision = await d.route(ex, BODY, {})
    assert ex.decision is decision
    assert decision.destination == "192.168.1.3:8000"
    assert decision.candidates == EPS
    r = decision.request
    assert (r.path, r.incoming_model, r.target_model, r.size_bytes) == (
        "/v1/completions",
        "m",
        "m",
        len(BODY),
    )
    assert len(seconds) == 1 and seconds[0] >= 0
    assert [c[0] for c in stats.calls] == ["serve", "on_scheduled"]
    entry = d.decisions.get("r1")
    assert entry is not None and entry["outcome"] != "rejected"


async def test_admitters_and_pre_request_hooks_run_unless_dry(caplog: Any) -> None:
    journal = Journal()
    hooks = [Hook(journal, "a"), Hook(journal, "b", fail=True)]
    d = director(pipeline(admitters=hooks[:1], pre_request=hooks))
    with caplog.at_level(logging.ERROR, log_name):
        await d.decide(d.new_request(HEADERS), BODY, {})
    assert journal.calls == [("a", "admit", 3), ("a", "pre", "192.168.1.3"),
                             ("b", "pre", "192.168.1.3")]  # fmt: skip
    assert [rec.getMessage() for rec in caplog.records] == ["pre-request hook failed"]
    journal.calls.clear()
    decision = await d.decide(d.new_request(HEADERS), BODY, {}, dry_run=True)
    assert journal.calls == [] and decision.destination == "192.168.1.3:8000"


async def test_an_admitter_denial_is_the_answer() -> None:
    journal = Journal()
    d = director(pipeline(admitters=[Hook(journal, "no", fail=True)]))
    with pytest.raises(InferenceError) as info:
        await d.decide(d.new_request(HEADERS), BODY, {})
    assert info.value.code is ErrorCode.FORBIDDEN and info.value.message == "denied"


async def test_no_candidates_is_a_503() -> None:
    d = director()
    with pytest.raises(InferenceError) as info:
        await d.decide(d.new_request(HEADERS), BODY, hint("10.9.9.9"))
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE


async def test_a_request_before_the_first_discovery_sync_waits_for_it() -> None:
    known: list[Endpoint] = []
    discovered = asyncio.Event()
    d = director(endpoints=known, discovered=discovered)
    waiting = asyncio.Event()
    wait = d.first_discovery

    async def first_discovery() -> None:
        waiting.set()
        await wait()

    d.first_discovery = first_discovery  # type: ignore[method-assign]
    routing = asyncio.create_task(d.route(d.begin(HEADERS), BODY, {}))
    await asyncio.wait_for(waiting.wait(), 5)
    assert not routing.done()  # waiting for the sync, not the empty pool's 503
    known.extend(EPS)
    discovered.set()
    decision = await asyncio.wait_for(routing, 5)
    assert decision.destination == "192.168.1.3:8000"


async def test_a_request_waits_for_the_first_sync_only_so_long() -> None:
    d = director(endpoints=[], discovered=asyncio.Event(), discovery_wait=0.05)
    with pytest.raises(InferenceError) as info:
        await asyncio.wait_for(d.route(d.begin(HEADERS), BODY, {}), 5)
    assert info.value.code is ErrorCode.SERVICE_UNAVAILABLE


@pytest.mark.parametrize(
    ("priority", "saturation", "shed"),
    [(-1, 1.0, True), (-1, 0.99, False), (0, 5.0, False), (-2, 3.0, True)],
)
async def test_legacy_admission_sheds_only_sheddable_requests_at_saturation(
    priority: int, saturation: float, shed: bool
) -> None:
    objectives = ObjectiveStore()
    objectives.replace({"o": priority})
    d = director(pipeline(saturation_detector=Detector(saturation)), objectives=objectives)
    request = d.new_request({**HEADERS, "x-llm-d-inference-objective": "o"})
    if not shed:
        assert (await d.decide(request, BODY, {})).destination == "192.168.1.3:8000"
        return
    with pytest.raises(InferenceError) as info:
        await d.decide(request, BODY, {})
    assert info.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert info.value.message == "system saturated, sheddable request dropped"


class Flow:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def admit(self, request: InferenceRequest, endpoints: Any) -> None:
        self.calls.append(("admit", [e.id for e in endpoints()]))

    def done(self, request: InferenceRequest, output_tokens: int = 0) -> None:
        self.calls.append(("done", output_tokens))


async def test_flow_control_admits_and_frees_a_request_that_fails_after_admission() -> None:
    flow = Flow()
    d = director(pipeline(saturation_detector=Detector(9.0)), flow=flow)
    objectives_request = d.new_request(HEADERS)
    objectives_request.priority = -1  # flow control, not legacy shedding, decides
    await d.decide(objectives_request, BODY, {})
    assert flow.calls == [("admit", [e.id for e in EPS])]
    with pytest.raises(InferenceError):
        await d.decide(d.new_request(HEADERS), BODY, hint())
    assert flow.calls[1:] == [("admit", [e.id for e in EPS]), ("done", 0)]


async def test_producers_run_in_order_and_a_stuck_one_times_out(caplog: Any) -> None:
    journal = Journal()
    stuck, good = Hook(journal, "stuck", fail=True), Hook(journal, "good")
    d = director(pipeline(producers=[stuck, good], producer_timeouts=[0.01, 5.0]))
    request = d.new_request(HEADERS)
    with caplog.at_level(logging.WARNING, log_name):
        decision = await d.decide(request, BODY, hint("192.168.1.1", "192.168.1.2"))
    assert journal.calls == [("stuck", "produce"), ("good", "produce")]
    assert request.attributes["produced"] == 2
    assert decision.destination == "192.168.1.2:8000"
    assert [rec.getMessage() for rec in caplog.records] == ["data producer failed"]


def test_fail_records_the_error_and_warns_on_5xx_only(caplog: Any) -> None:
    stats = Stats()
    d = director(stats=stats)
    ex = d.begin({"x-request-id": "bad"})
    with caplog.at_level(logging.WARNING, log_name):
        d.fail(ex, InferenceError(ErrorCode.BAD_REQUEST, "no model"))
        d.fail(ex, InferenceError(ErrorCode.INTERNAL, "boom"))
        d.fail(None, InferenceError(ErrorCode.INTERNAL, "early"))
    assert stats.calls[1:] == [
        ("on_error", ex.request, "BadRequest"),
        ("on_error", ex.request, "Internal"),
        ("on_error", None, "Internal"),
    ]
    assert [rec.getMessage() for rec in caplog.records] == ["request failed", "request failed"]
    entry = d.decisions.get("bad")
    assert entry is not None and entry["status"] == 500
    assert entry["error"] == "inference error: Internal - boom"


def test_protocol_errors_reach_the_stats() -> None:
    stats = Stats()
    director(stats=stats).protocol_error("no_request")
    assert stats.calls[1:] == [("on_protocol_error", "no_request")]


# ---- responses --------------------------------------------------------------------------------


async def _routed(d: Director) -> Any:
    ex = d.begin(HEADERS)
    await d.route(ex, BODY, {})
    return ex


async def test_response_headers_mark_the_response_and_run_the_hooks(caplog: Any) -> None:
    journal = Journal()
    stats = Stats()
    hooks = [Hook(journal, "a"), Hook(journal, "b", fail=True)]
    d = director(pipeline(response_headers=hooks), stats=stats)
    ex = await _routed(d)
    with caplog.at_level(logging.ERROR, log_name):
        out = d.on_response_headers(ex, {":status": "503"}, "192.168.1.3:8000")
    assert out == {"x-went-into-resp-headers": "true", "x-hook": "b"}
    assert journal.calls == [("a", "headers", 503), ("b", "headers", 503)]
    assert [rec.getMessage() for rec in caplog.records] == ["response-headers hook failed"]
    assert ex.response.served_endpoint == "192.168.1.3:8000"
    assert ex.response.streaming is False and ex.buffer == bytearray()
    assert ("on_error", ex.request, "ModelServerError") in stats.calls
    assert ("on_response_status", ex.request, 503) in stats.calls


async def test_the_status_and_streaming_are_read_from_the_headers() -> None:
    stats = Stats()
    d = director(stats=stats)
    ex = await _routed(d)
    d.on_response_headers(ex, {"content-type": "text/event-stream; charset=utf-8"}, "")
    assert ex.response.status == 200 and ex.response.streaming is True
    assert ex.buffer is None and ex.state is not None
    assert not any(c[0] == "on_error" for c in stats.calls)
    ex = await _routed(d)
    d.on_response_headers(ex, {":status": "abc"}, "")
    assert ex.response.status == 0


async def test_a_held_response_is_released_whole_at_its_end() -> None:
    journal = Journal()
    d = director(pipeline(response_complete=[Hook(journal, "c")]))
    ex = await _routed(d)
    d.on_response_headers(ex, {":status": "200"}, "")
    assert d.on_response_chunk(ex, b'{"a":', False, hold_limit=100) is None
    assert ex.size == 5 and journal.calls == []
    out = d.on_response_chunk(ex, b"1}", True, hold_limit=100)
    assert out == Forward(b'{"a":1}', whole=True, changed=False)
    assert ex.size == 7 and ex.buffer is None
    assert journal.calls == [("c", "complete", TerminationCause.NATURAL)]


async def test_a_held_response_past_the_limit_passes_through() -> None:
    d = director()
    ex = await _routed(d)
    d.on_response_headers(ex, {":status": "200"}, "")
    assert d.on_response_chunk(ex, b"12345", False, hold_limit=8) is None
    assert d.on_response_chunk(ex, b"678", False, hold_limit=8) is None  # exactly the limit
    out = d.on_response_chunk(ex, b"9", False, hold_limit=8)
    assert out == Forward(b"123456789", whole=False, changed=False)
    assert ex.buffer is None
    assert d.on_response_chunk(ex, b"0", False, hold_limit=8) == Forward(b"0", False, False)
    assert not ex.completed
    d.on_response_chunk(ex, b"", True, hold_limit=8)
    assert ex.completed


async def test_a_body_without_headers_is_held_and_trailers_release_it() -> None:
    journal = Journal()
    d = director(pipeline(response_complete=[Hook(journal, "c")]))
    ex = await _routed(d)
    assert d.on_response_chunk(ex, b"ab", False, hold_limit=None) is None
    assert ex.response is not None and ex.response.headers == {}
    assert d.on_response_trailers(ex) == Forward(b"ab", whole=True, changed=False)
    assert journal.calls == [("c", "complete", TerminationCause.NATURAL)]
    assert d.on_response_trailers(ex) is None  # nothing held; completes no second time
    assert len(journal.calls) == 1


async def test_completion_runs_once_and_only_for_a_routed_request(caplog: Any) -> None:
    journal = Journal()
    flow, stats = Flow(), Stats()
    hooks = [Hook(journal, "x", fail=True), Hook(journal, "y")]
    d = director(pipeline(response_complete=hooks), flow=flow, stats=stats)
    unrouted = d.begin(HEADERS)
    d.complete(unrouted, TerminationCause.CLIENT_DISCONNECT)
    assert journal.calls == [] and not unrouted.completed
    ex = await _routed(d)
    with caplog.at_level(logging.ERROR, log_name):
        d.complete(ex, TerminationCause.CLIENT_DISCONNECT)
        d.complete(ex, TerminationCause.NATURAL)
    assert journal.calls == [("x", "complete", TerminationCause.CLIENT_DISCONNECT),
                             ("y", "complete", TerminationCause.CLIENT_DISCONNECT)]  # fmt: skip
    assert [rec.getMessage() for rec in caplog.records] == ["response-complete hook failed"]
    assert flow.calls[-1] == ("done", 0)
    assert [c[0] for c in stats.calls].count("on_complete") == 1
    done = next(c for c in stats.calls if c[0] == "on_complete")
    assert done[2].end_of_stream is True and done[2].request_id == ex.request.request_id
    assert done[3] >= 0 and done[4] == 0


async def test_a_held_response_has_its_usage_read_before_completion() -> None:
    flow, stats = Flow(), Stats()
    d = director(flow=flow, stats=stats)
    ex = await _routed(d)
    d.on_response_headers(ex, {":status": "200", "content-type": "application/json"}, "")
    body = json.dumps(
        {"model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}
    ).encode()
    assert d.on_response_chunk(ex, body, True, hold_limit=None) == Forward(body, True, False)
    assert ex.response.usage.completion_tokens == 7
    assert flow.calls[-1] == ("done", 7)
    assert ("on_chunk", ex.request, False, ex.started) in stats.calls


async def test_streamed_chunks_get_the_clients_model_name_back_and_complete_naturally() -> None:
    journal, stats = Journal(), Stats()
    d = director(pipeline(response_complete=[Hook(journal, "c")]), stats=stats)
    ex = await _routed(d)
    ex.request.target_model = "m-v2"  # as a rewrite would have set it
    d.on_response_headers(ex, {":status": "200", "content-type": "text/event-stream"}, "")
    chunk = b'data: {"model": "m-v2"}\n\n'
    out = d.on_response_chunk(ex, chunk, False, hold_limit=None)
    assert out == Forward(b'data: {"model": "m"}\n\n', whole=False, changed=True)
    assert ("on_chunk", ex.request, True, ex.started) in stats.calls
    d.on_response_chunk(ex, b"data: [DONE]\n\n", True, hold_limit=None)
    assert journal.calls == [("c", "complete", TerminationCause.NATURAL)]


async def test_trailers_complete_a_streamed_response_naturally() -> None:
    journal = Journal()
    d = director(pipeline(response_complete=[Hook(journal, "c")]))
    ex = await _routed(d)
    d.on_response_headers(ex, {":status": "200", "content-type": "text/event-stream"}, "")
    d.on_response_chunk(ex, b"data: {}\n\n", False, hold_limit=None)
    assert d.on_response_trailers(ex) is None
    assert journal.calls == [("c", "complete", TerminationCause.NATURAL)]


async def test_a_body_without_headers_belongs_to_its_request() -> None:
    d = director()
    ex = await _routed(d)
    d.on_response_chunk(ex, b"x", False, hold_limit=None)
    assert ex.response is not None and ex.response.request_id == ex.request.request_id
