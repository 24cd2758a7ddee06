"""Which response bodies the Director reads (``epp.requestcontrol.bodyneed``): a streamed answer
nothing needs passes back unread and still completes at its end; a model rewrite, flow control, a
plugin without ``ResponseBodyNeed`` or one that asks, and the metrics sample each keep it read; in
STREAMED mode a held answer is copied, each chunk going on at once."""

from __future__ import annotations

import json
import logging
import random
from types import SimpleNamespace
from typing import Any

import pytest

from epp.plugin import (
    InferenceRequest,
    ParseResult,
    ProfileResult,
    RequestBody,
    ResponseBodyNeed,
    ResponseInfo,
    SchedulingResult,
    TerminationCause,
    TypedName,
)
from epp.plugin.params import decode
from epp.plugins.parsers.openai import OpenAIParser
from epp.requestcontrol.bodyneed import BodyNeed
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Decision, Exchange, Forward
from tests.builders import FakeHandle, make_endpoint, make_request

SSE = {":status": "200", "content-type": "text/event-stream"}
JSON = {":status": "200", "content-type": "application/json"}
CHUNK = b'data: {"model":"served","choices":[{"delta":{"content":"t"}}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'


class Hook:
    """A response hook of both kinds; ``need`` set: it has ``needs_response_body``."""

    def __init__(self, journal: list[Any], need: bool | None = None) -> None:
        self.typed_name = TypedName("hook", "h")
        self.journal = journal

    def response_streaming(self, request: InferenceRequest, response: ResponseInfo) -> None:
        self.journal.append("streaming")

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        self.journal.append(("complete", response.termination_cause, response.usage.prompt_tokens))


class Asker(Hook):
    def __init__(self, journal: list[Any], need: bool | Exception) -> None:
        super().__init__(journal)
        self.need = need

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        self.journal.append(("asked", response.status))
        if isinstance(self.need, Exception):
            raise self.need
        return self.need


class Stats:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def serve_models_from(self, fn: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *a: self.calls.append((name, *a))


class Flow:
    def done(self, request: InferenceRequest, output_tokens: int = 0) -> None:
        pass


def director(hooks: list[Any], *, ratio: float = 0.0, stats: Any = None, flow: Any = None) -> Any:
    pipeline: Any = SimpleNamespace(
        parsers=[], producers=[], producer_timeouts=[], screeners=[], request_header=[],
        response_headers=[], response_streaming=hooks, response_complete=hooks,
        saturation_detector=None,
    )  # fmt: skip
    return Director(
        pipeline=pipeline,
        scheduler=None,  # type: ignore[arg-type]
        endpoints=lambda: [],
        objectives=SimpleNamespace(),  # type: ignore[arg-type]
        clock=lambda: 0.0,
        flow=flow,
        stats=stats,
        response_sample=ratio,
        sample_rng=random.Random(3),
    )


def routed(*, stream: bool = True, rewritten: bool = False) -> Exchange:
    request = make_request(target_model="served", incoming_model="asked" if rewritten else "served")
    parser = OpenAIParser(name="p", params=decode(OpenAIParser.Params, {}), handle=FakeHandle())
    body = RequestBody(kind="chat", payload={"model": "m", "stream": stream}, raw=b"{}")
    result = SchedulingResult({"d": ProfileResult((make_endpoint(0),))}, "d")
    decision = Decision(request, result, parser, ParseResult("m", body), b"{}", "", ())
    return Exchange(request, started=0.0, decision=decision)


def test_a_streamed_answer_nothing_needs_passes_back_unread_and_completes_at_its_end() -> None:
    journal: list[Any] = []
    stats = Stats()
    d = director([Asker(journal, False)], stats=stats)
    ex = routed()
    d.on_response_headers(ex, SSE, "")
    assert ex.skip_body and ex.state is None
    assert journal == [("asked", 200)]
    out = d.on_response_chunk(ex, CHUNK, False, hold_limit=None)
    assert out == Forward(CHUNK, whole=False, changed=False) and out.body is CHUNK
    assert not ex.completed
    d.on_response_chunk(ex, USAGE, True, hold_limit=None)
    # no hook saw a chunk, no chunk was timed, usage is unknown; completion came once, at the end
    assert journal == [("asked", 200), ("complete", TerminationCause.NATURAL, 0)]
    assert not any(c[0] == "on_chunk" for c in stats.calls)
    (done,) = [c for c in stats.calls if c[0] == "on_complete"]
    assert done[4] is None  # no response size for a body the EPP did not read


@pytest.mark.parametrize(
    ("hooks", "kw", "stream", "rewritten"),
    [
        pytest.param(lambda j: [Hook(j)], {}, True, False, id="a-plugin-without-the-capability"),
        pytest.param(lambda j: [Asker(j, True)], {}, True, False, id="a-plugin-that-asks"),
        pytest.param(lambda j: [Asker(j, False)], {}, True, True, id="a-rewritten-model"),
        pytest.param(lambda j: [], {"flow": Flow()}, True, False, id="flow-control"),
        pytest.param(lambda j: [], {"ratio": 1.0}, True, False, id="sampled"),
        pytest.param(lambda j: [], {}, False, False, id="a-non-streamed-answer"),
    ],
)
def test_what_keeps_a_body_read(
    hooks: Any, kw: dict[str, Any], stream: bool, rewritten: bool
) -> None:
    journal: list[Any] = []
    d = director(hooks(journal), **kw)
    ex = routed(stream=stream, rewritten=rewritten)
    d.on_response_headers(ex, SSE if stream else JSON, "")
    assert not ex.skip_body
    d.on_response_chunk(ex, CHUNK, False, hold_limit=None)
    d.on_response_chunk(ex, USAGE, True, hold_limit=None)
    assert ex.completed and ex.response is not None
    assert ex.response.usage.prompt_tokens == 3  # the body was read


def test_a_plugin_that_fails_to_answer_counts_as_needing_the_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[Any] = []
    d = director([Asker(journal, RuntimeError("broke"))])
    ex = routed()
    with caplog.at_level(logging.ERROR, "epp.requestcontrol.bodyneed"):
        d.on_response_headers(ex, SSE, "")
    assert not ex.skip_body
    assert [r.getMessage() for r in caplog.records] == ["needs_response_body failed"]


def test_no_plugin_is_asked_when_one_without_the_capability_needs_every_body() -> None:
    journal: list[Any] = []
    need = BodyNeed([Asker(journal, False), Hook(journal)], flow_controlled=False, sample_ratio=0)
    assert need.wanted(make_request(), ResponseInfo(request_id="r", headers={}), rewritten=False)
    assert journal == []


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5, 1.0])
def test_the_metrics_sample_reads_the_given_share(ratio: float) -> None:
    need = BodyNeed([], flow_controlled=False, sample_ratio=ratio, rng=random.Random(7))
    info = ResponseInfo(request_id="r", headers={})
    read = sum(need.wanted(make_request(), info, rewritten=False) for _ in range(4000))
    assert abs(read / 4000 - ratio) < 0.03


def test_the_capability_is_a_runtime_checkable_role_extra() -> None:
    assert isinstance(Asker([], False), ResponseBodyNeed)
    assert not isinstance(Hook([]), ResponseBodyNeed)


def test_copied_held_answer_goes_on_chunk_by_chunk_restored_and_its_usage_is_read() -> None:
    journal: list[Any] = []
    d = director([Hook(journal)])
    ex = routed(stream=False, rewritten=True)
    d.on_response_headers(ex, JSON, "")
    whole = {"model": "served", "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
    text = json.dumps(whole, separators=(",", ":")).encode()
    first = d.on_response_chunk(ex, text[:20], False, hold_limit=None, copy_held=True)
    assert first == Forward(text[:20].replace(b'"served"', b'"asked"'), whole=False, changed=True)
    assert journal == []  # held answers run the hooks once, at their end
    last = d.on_response_chunk(ex, text[20:], True, hold_limit=None, copy_held=True)
    assert last == Forward(text[20:], whole=False, changed=False)
    assert journal == ["streaming", ("complete", TerminationCause.NATURAL, 4)]


def test_trailers_end_a_copied_answer_without_sending_it_again() -> None:
    journal: list[Any] = []
    d = director([Hook(journal)])
    ex = routed(stream=False)
    d.on_response_headers(ex, JSON, "")
    d.on_response_chunk(
        ex, b'{"usage":{"prompt_tokens":2}}', False, hold_limit=None, copy_held=True
    )
    assert d.on_response_trailers(ex, copy_held=True) is None
    assert journal == ["streaming", ("complete", TerminationCause.NATURAL, 2)]


def test_the_built_in_default_profile_reads_no_body_nothing_needs() -> None:
    # every ResponseComplete/ResponseStreaming plugin of the default config declares what it
    # needs, so with sampling off a plain streamed answer is handed back unread
    from epp.config.loader import load_config
    from epp.plugin import ResponseBodyNeed
    from epp.plugin.registry import PluginRegistry
    from tests.unit.scheduling.test_scheduler_golden import ClockHandle

    handle = ClockHandle()
    pipeline = load_config(
        None, registry=PluginRegistry.from_entry_points(), handle_for=lambda: handle
    )
    hooks = [*pipeline.response_streaming, *pipeline.response_complete]
    assert hooks and all(isinstance(h, ResponseBodyNeed) for h in hooks), hooks
