"""What the Director lets operators and plugins observe (``epp.requestcontrol.director``): the
fields of its log lines, the spans of a traced request, the durations it reports, and the exact
arguments admitters, the flow controller, the saturation detector and response hooks receive."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from epp.observability.decisions import DecisionLog
from epp.observability.tracing import TRACE_KEY, Tracing
from epp.plugin import (
    CycleState,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PickResult,
    Profile,
    ResponseInfo,
    ScoredEndpoint,
    TerminationCause,
)
from epp.plugin.params import decode
from epp.plugins.parsers.openai import OpenAIParser
from epp.requestcontrol import director as director_module
from epp.requestcontrol import responses as responses_module
from epp.requestcontrol.director import Director
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.rewrites import ModelRewrite, RewriteRule, RewriteStore, RewriteTarget
from epp.scheduling.scheduler import Scheduler
from tests.builders import FakeHandle
from tests.unit.requestcontrol.test_director import (
    BODY,
    EPS,
    HEADERS,
    Detector,
    Highest,
    Hook,
    Journal,
    Named,
    One,
    Stats,
    director,
    hint,
    log_name,
    pipeline,
)

# ---- log lines --------------------------------------------------------------------------------


def _fields(caplog: pytest.LogCaptureFixture, message: str) -> dict[str, Any]:
    (record,) = [r for r in caplog.records if r.getMessage() == message]
    return {k: getattr(record, k, None) for k in ("request_id", "plugin", "reason", "endpoint")}


async def test_failure_lines_name_the_request_and_the_plugin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = Journal()
    broken = Hook(journal, "broken", fail=True)
    d = director(
        pipeline(
            request_header=[broken],
            pre_request=[broken],
            response_headers=[broken],
            response_complete=[broken],
            producers=[broken],
            producer_timeouts=[0.01],
        )
    )
    with caplog.at_level(logging.DEBUG, log_name):
        ex = d.begin({**HEADERS, "x-request-id": "r-log"})
        await d.route(ex, BODY, {})
        d.on_response_headers(ex, {":status": "200"}, "192.168.1.3:8000")
        d.complete(ex, TerminationCause.NATURAL)
    plugin = "broken/hook"  # name/type, as upstream prints a plugin
    for message in (
        "request-header processor failed",
        "pre-request hook failed",
        "response-headers hook failed",
        "response-complete hook failed",
    ):
        assert _fields(caplog, message) == {
            "request_id": "r-log",
            "plugin": plugin,
            "reason": None,
            "endpoint": None,
        }, message
    producer = _fields(caplog, "data producer failed")
    assert (producer["request_id"], producer["plugin"]) == ("r-log", plugin)
    assert producer["reason"] == "TimeoutError()"
    assert _fields(caplog, "request scheduled") == {
        "request_id": "r-log",
        "plugin": None,
        "reason": None,
        "endpoint": "192.168.1.3:8000",
    }


def test_a_failed_request_line_carries_its_id_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    d = director()
    ex = d.begin({"x-request-id": "r-fail"})
    with caplog.at_level(logging.WARNING, log_name):
        d.fail(ex, InferenceError(ErrorCode.INTERNAL, "boom"))
    assert _fields(caplog, "request failed") == {
        "request_id": "r-fail",
        "plugin": None,
        "reason": "Internal - boom",
        "endpoint": None,
    }


# ---- the clock --------------------------------------------------------------------------------


class Clock:
    """Stands in for the ``time`` module the Director reads: every reading advances the clock by
    a fixed step, so each duration it reports is an exact number of steps."""

    def __init__(self) -> None:
        self.perf, self.mono, self.ns = 1000.0, 5000.0, 1_700_000_000_000_000_000

    def perf_counter(self) -> float:
        self.perf += 0.25
        return self.perf

    def monotonic(self) -> float:
        self.mono += 2.0
        return self.mono

    def time_ns(self) -> int:
        self.ns += 1_000_000
        return self.ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(director_module, "time", fake)
    monkeypatch.setattr(responses_module, "time", fake)  # the Director's response side
    return fake


async def test_durations_are_readings_minus_their_start(clock: Clock) -> None:
    stats, seconds = Stats(), []
    d = director(stats=stats, on_scheduled=seconds.append)
    ex = d.begin({**HEADERS, "x-request-id": "r-time"})
    assert ex.started == 5002.0
    await d.route(ex, BODY, {})
    assert seconds == [0.25]  # one reading before scheduling, one after
    entry = d.decisions.get("r-time")
    assert entry is not None and entry["schedulingSeconds"] == 0.75  # route's own span
    d.on_response_headers(ex, {":status": "200"}, "")
    d.on_response_chunk(ex, b"{}", True, hold_limit=None)
    (done,) = [c for c in stats.calls if c[0] == "on_complete"]
    assert done[3] == 2.0 and done[4] == 2  # completion's reading minus the headers' one; bytes


# ---- spans ------------------------------------------------------------------------------------


@pytest.fixture
def spans() -> Iterator[tuple[Tracing, Callable[[], dict[str, list[ReadableSpan]]]]]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(exporter=exporter, sampler=ALWAYS_ON, plugin_threshold=0.0, environ={})

    def finished() -> dict[str, list[ReadableSpan]]:
        tracing.provider.force_flush()
        out: dict[str, list[ReadableSpan]] = {}
        for span in exporter.get_finished_spans():
            out.setdefault(span.name, []).append(span)
        return out

    yield tracing, finished
    tracing.shutdown()


async def test_a_traced_request_has_parse_admission_profile_and_producer_spans(
    spans: tuple[Tracing, Callable[[], dict[str, list[ReadableSpan]]]], clock: Clock
) -> None:
    tracing, finished = spans
    journal = Journal()
    producer = Hook(journal, "good")
    d = director(pipeline(producers=[producer], producer_timeouts=[5.0]))
    ex = d.begin({**HEADERS, "x-request-id": "r-trace"})
    ex.trace = tracing.begin(HEADERS, "r-trace")
    await d.route(ex, BODY, {})
    ex.trace.routed()
    ex.trace.end(200)
    got = finished()
    assert set(got) == {
        "gateway.request",
        "gateway.request_orchestration",
        "llm_d.epp.parse",
        "llm_d.epp.admission",
        "llm_d.epp.producer.hook",
        "run_scheduler_profile",
        "filter_endpoints",  # the scheduler's spans: it was handed the trace
        "llm_d.epp.scoring",
        "pick_endpoints",
        "llm_d.epp.scorer.scorer",
        "llm_d.epp.picker.picker",
    }
    (parse,), (admission,) = got["llm_d.epp.parse"], got["llm_d.epp.admission"]
    parser = d._pipeline.parsers[0]
    assert dict(parse.attributes or {}) == {"llm_d.epp.parser": str(parser.typed_name)}
    # parse: the readings around parsing; admission: from the end of parsing to its own end
    assert (parse.start_time, parse.end_time) == (clock.ns - 2_000_000, clock.ns - 1_000_000)
    assert (admission.start_time, admission.end_time) == (parse.end_time, clock.ns)
    (produced,) = got["llm_d.epp.producer.hook"]
    assert dict(produced.attributes or {}) == {
        "llm_d.epp.plugin.type": "hook",
        "llm_d.epp.plugin.name": "good",
    }
    assert produced.end_time is not None and produced.start_time is not None
    assert produced.end_time - produced.start_time == 250_000_000  # one clock step
    (profile,) = got["run_scheduler_profile"]
    assert dict(profile.attributes or {}) == {"llm_d.epp.scheduling.profile.name": "p"}


class Seen(Named):
    """An admitter that keeps what it was handed."""

    def __init__(self) -> None:
        super().__init__("admitter", "seen")
        self.args: tuple[CycleState, InferenceRequest, Sequence[Endpoint]] | None = None

    def admit(self, cycle: CycleState, request: InferenceRequest, pool: Any) -> None:
        self.args = (cycle, request, pool)


async def test_admitters_get_the_cycle_with_the_trace_the_request_and_the_pool(
    spans: tuple[Tracing, Callable[[], dict[str, list[ReadableSpan]]]],
) -> None:
    tracing, _ = spans
    seen = Seen()
    d = director(pipeline(admitters=[seen]))
    request = d.new_request(HEADERS)
    trace = tracing.begin(HEADERS, request.request_id)
    await d.decide(request, BODY, hint("192.168.1.1", "192.168.1.2"), trace)
    assert seen.args is not None
    cycle, got, pool = seen.args
    assert got is request and pool == EPS[:2]
    assert cycle.now == 42.0 and cycle.rng is d._rng
    assert cycle.data[TRACE_KEY] is trace


async def test_a_dry_run_hands_on_the_request_parser_and_body_and_keeps_the_trace(
    spans: tuple[Tracing, Callable[[], dict[str, list[ReadableSpan]]]],
) -> None:
    tracing, finished = spans
    seen = Seen()
    d = director(pipeline(admitters=[seen]))
    request = d.new_request(HEADERS)
    trace = tracing.begin(HEADERS, request.request_id)
    decision = await d.decide(request, BODY, {}, trace, dry_run=True)
    assert seen.args is None  # no admitters in a dry run
    assert decision.request is request and decision.parser is d._pipeline.parsers[0]
    assert decision.body == BODY and decision.parsed.model == "m"
    assert decision.candidates == EPS and decision.destination == "192.168.1.3:8000"
    trace.routed()
    names = set(finished())
    assert "run_scheduler_profile" in names and "llm_d.epp.parse" in names
    assert "llm_d.epp.admission" not in names


# ---- flow control and the saturation detector -------------------------------------------------


class Flow:
    def __init__(self) -> None:
        self.admitted: list[tuple[InferenceRequest, list[Endpoint]]] = []
        self.done_with: list[tuple[InferenceRequest, int]] = []

    async def admit(self, request: InferenceRequest, endpoints: Any) -> None:
        self.admitted.append((request, list(endpoints())))

    def done(self, request: InferenceRequest, output_tokens: int = -1) -> None:
        self.done_with.append((request, output_tokens))


async def test_flow_control_gets_the_request_back_when_it_ends() -> None:
    flow = Flow()
    d = director(flow=flow)
    ex = d.begin(HEADERS)
    await d.route(ex, BODY, {})
    assert flow.admitted == [(ex.request, EPS)]
    d.on_response_headers(ex, {":status": "200"}, "")
    usage = {"prompt_tokens": 1, "completion_tokens": 4}
    d.on_response_chunk(ex, json.dumps({"usage": usage}).encode(), True, hold_limit=None)
    assert flow.done_with == [(ex.request, 4)]
    failed = d.new_request(HEADERS)
    with pytest.raises(InferenceError):
        await d.decide(failed, BODY, hint())  # no candidates after admission
    assert flow.done_with[1:] == [(failed, -1)]


class Saturation(Detector):
    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float:
        self.seen = (now, list(endpoints))
        return self.value


async def test_legacy_shedding_asks_the_detector_with_the_clock_and_the_pool() -> None:
    detector = Saturation(1.0)
    d = director(pipeline(saturation_detector=detector))
    request = d.new_request(HEADERS)
    request.priority = -1
    with pytest.raises(InferenceError):
        await d.decide(request, BODY, {})
    assert detector.seen == (42.0, EPS)


# ---- the response side ------------------------------------------------------------------------


class Headers(Named):
    def __init__(self) -> None:
        super().__init__("headers", "h")
        self.seen: list[tuple[InferenceRequest, ResponseInfo]] = []

    def response_headers(self, request: Any, response: ResponseInfo, out: dict[str, str]) -> None:
        self.seen.append((request, response))


async def test_response_hooks_see_the_request_its_id_and_the_headers() -> None:
    hook = Headers()
    d = director(pipeline(response_headers=[hook]))
    ex = d.begin({**HEADERS, "x-request-id": "r-resp"})
    await d.route(ex, BODY, {})
    headers = {":status": "201", "content-type": "application/json", "x-served": "yes"}
    d.on_response_headers(ex, headers, "192.168.1.3:8000")
    ((request, info),) = hook.seen
    assert request is ex.request and info is ex.response
    assert info.request_id == "r-resp" and info.headers == headers and info.status == 201


async def test_a_request_that_asked_to_stream_streams_whatever_the_content_type() -> None:
    d = director()
    ex = d.begin(HEADERS)
    await d.route(ex, json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode(), {})
    d.on_response_headers(ex, {":status": "200", "content-type": "application/json"}, "")
    assert ex.response is not None and ex.response.streaming is True
    assert ex.buffer is None and ex.state is not None
    chunk = b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 5}}\n\n'
    assert d.on_response_chunk(ex, chunk, False, hold_limit=None) is not None  # not held
    assert ex.response.usage.completion_tokens == 5


def test_a_rejection_keeps_its_drop_reason_in_the_decision_log() -> None:
    d = director()
    ex = d.begin({"x-request-id": "r-drop"})
    d.fail(ex, InferenceError(ErrorCode.RESOURCE_EXHAUSTED, "full", drop_reason="saturated"))
    entry = d.decisions.get("r-drop")
    assert entry is not None and entry["dropReason"] == "saturated" and entry["status"] == 429


class Recording(OpenAIParser):
    """The OpenAI parser, keeping what the Director tells it about each response."""

    requests: list[Any]
    states: list[Any]
    parsed: list[tuple[bytes, Any, bool, bool]]

    def parse_request(self, path: str, body: bytes, headers: Any) -> Any:
        self.requests.append(headers)
        return super().parse_request(path, body, headers)

    def new_response_state(self, headers: Any = None) -> Any:
        self.states.append(headers)
        return super().new_response_state(headers)

    def parse_response(
        self, chunk: bytes, headers: Any, *, streaming: bool, end_of_stream: bool
    ) -> Any:
        self.parsed.append((chunk, headers, streaming, end_of_stream))
        return super().parse_response(
            chunk, headers, streaming=streaming, end_of_stream=end_of_stream
        )


def recording() -> Recording:
    parser = Recording(name="rec", params=decode(Recording.Params, {}), handle=FakeHandle())
    parser.requests, parser.states, parser.parsed = [], [], []
    return parser


async def test_the_parser_hears_the_response_headers_and_that_a_held_body_is_whole() -> None:
    parser = recording()
    d = director(pipeline(parsers=[parser]))
    ex = d.begin(HEADERS)
    await d.route(ex, BODY, {})
    headers = {":status": "200", "content-type": "application/json"}
    d.on_response_headers(ex, headers, "")
    d.on_response_chunk(ex, b"{}", True, hold_limit=None)
    assert parser.requests == [HEADERS]
    assert parser.parsed == [(b"{}", headers, False, True)]
    sse = {":status": "200", "content-type": "text/event-stream"}
    ex = d.begin(HEADERS)
    await d.route(ex, BODY, {})
    d.on_response_headers(ex, sse, "")
    assert parser.states == [sse]


async def test_the_last_event_of_a_stream_counts_without_a_final_newline() -> None:
    d = director()
    ex = d.begin(HEADERS)
    await d.route(ex, BODY, {})
    d.on_response_headers(ex, {":status": "200", "content-type": "text/event-stream"}, "")
    d.on_response_chunk(ex, b'data: {"choices": []}\n\n', False, hold_limit=None)
    last = b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 9}}'
    d.on_response_chunk(ex, last, True, hold_limit=None)
    assert ex.response is not None and ex.response.usage.completion_tokens == 9


# ---- what the Director passes on --------------------------------------------------------------


async def test_route_reports_the_request_and_its_result_and_keeps_the_parsed_body() -> None:
    stats = Stats()
    d = director(stats=stats)
    ex = d.begin(HEADERS)
    decision = await d.route(ex, BODY, {})
    assert stats.calls[1:] == [("on_scheduled", ex.request, decision.result)]
    assert decision.body == BODY  # nothing rewritten: the client's bytes go on
    assert ex.request.body is decision.parsed.body
    assert ex.request.body.kind == "completions" and ex.request.body.payload == json.loads(BODY)


class Saw(Named):
    """Pre-request and completion hooks that keep the request they were handed."""

    def __init__(self) -> None:
        super().__init__("hook", "saw")
        self.seen: list[tuple[str, Any, Any]] = []

    def pre_request(self, request: InferenceRequest, result: Any) -> None:
        self.seen.append(("pre", request, result))

    def response_complete(self, request: Any, response: ResponseInfo) -> None:
        self.seen.append(("complete", request, response))


async def test_hooks_get_the_request_and_an_unanswered_request_completes_with_empty_headers() -> (
    None
):
    saw, stats = Saw(), Stats()
    d = director(pipeline(pre_request=[saw], response_complete=[saw]), stats=stats)
    ex = d.begin({**HEADERS, "x-request-id": "r-gone"})
    decision = await d.route(ex, BODY, {})
    d.complete(ex, TerminationCause.CLIENT_DISCONNECT)  # before any response arrived
    (pre, complete) = saw.seen
    assert pre == ("pre", ex.request, decision.result)
    assert complete[:2] == ("complete", ex.request)
    info = complete[2]
    assert (info.request_id, info.headers, info.termination_cause) == (
        "r-gone",
        {},
        TerminationCause.CLIENT_DISCONNECT,
    )
    (done,) = [c for c in stats.calls if c[0] == "on_complete"]
    assert done[1] is ex.request and done[2] is info


class TopTwo(Named):
    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult:
        best = sorted(scored, key=lambda s: s.score, reverse=True)[:2]
        return PickResult(targets=tuple(s.endpoint for s in best))


async def test_several_targets_make_a_comma_separated_destination() -> None:
    profile = Profile("p", (), ((Highest("scorer"), 1.0),), TopTwo("picker"))
    scheduler = Scheduler(
        profiles={"p": profile},
        handler=One("handler"),
        observe=lambda *a: None,
        count_error=lambda *a: None,
    )
    d = Director(
        pipeline=pipeline(),
        scheduler=scheduler,
        endpoints=lambda: list(EPS),
        objectives=ObjectiveStore(),
        clock=lambda: 42.0,
    )
    decision = await d.decide(d.new_request(HEADERS), BODY, {})
    assert decision.destination == "192.168.1.3:8000,192.168.1.2:8000"


def test_a_seeded_rng_makes_random_picks_reproducible() -> None:
    d = director()  # seeded with 1
    expected = random.Random(1)
    assert [d.pick_random({}) for _ in range(8)] == [expected.choice(EPS) for _ in range(8)]


def test_the_decision_log_given_is_the_one_kept() -> None:
    log = DecisionLog()
    assert director(decisions=log).decisions is log


def test_producers_and_their_timeouts_must_pair_up() -> None:
    journal = Journal()
    with pytest.raises(ValueError):
        director(pipeline(producers=[Hook(journal, "p")], producer_timeouts=[]))


async def test_a_rewrite_is_reported_to_its_callback() -> None:
    rule = RewriteRule(models=("m",), targets=(RewriteTarget("m-v2", 1),))
    seen: list[tuple[str, str, str]] = []
    d = director(
        rewrites=RewriteStore([ModelRewrite("canary", (rule,))]),
        on_rewrite=lambda *a: seen.append(a),
    )
    decision = await d.decide(d.new_request(HEADERS), BODY, {})
    assert seen == [("canary", "m", "m-v2")]
    assert json.loads(decision.body)["model"] == "m-v2"
