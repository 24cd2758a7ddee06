"""``ResponseStreaming`` hooks: run by the Director on every response chunk after the parser read
it (so a streamed response id is known on the chunk that carries it), before completion, in
configuration order; one that raises is logged and neither the stream nor the others stop."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from epp.plugin import (
    InferenceRequest,
    ParseResult,
    ProfileResult,
    RequestBody,
    ResponseInfo,
    ResponseStreaming,
    SchedulingResult,
    TypedName,
)
from epp.plugin.params import decode
from epp.plugins.parsers.openai import OpenAIParser
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Decision, Exchange
from tests.builders import FakeHandle, make_endpoint, make_request

SSE = "text/event-stream"


class Recorder:
    """A hook of both kinds that writes what it saw into a shared journal."""

    def __init__(self, name: str, journal: list[tuple[Any, ...]], *, fail: bool = False) -> None:
        self.typed_name = TypedName("recorder", name)
        self.journal = journal
        self.fail = fail

    def response_streaming(self, request: InferenceRequest, response: ResponseInfo) -> None:
        self.journal.append((self.typed_name.name, response.response_id, response.end_of_stream))
        if self.fail:
            raise RuntimeError("hook broke")

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        self.journal.append((self.typed_name.name, "complete"))


def event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


def director(hooks: list[Recorder]) -> Director:
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
    )


def routed(*, stream: bool) -> Exchange:
    request = make_request(target_model="m", incoming_model="m")
    parser = OpenAIParser(name="p", params=decode(OpenAIParser.Params, {}), handle=FakeHandle())
    body = RequestBody(kind="responses", payload={"model": "m", "stream": stream}, raw=b"{}")
    result = SchedulingResult({"d": ProfileResult((make_endpoint(0),))}, "d")
    decision = Decision(request, result, parser, ParseResult("m", body), b"{}", "", ())
    return Exchange(request, started=0.0, decision=decision)


def test_hooks_see_the_response_id_on_its_first_chunk_in_order_before_completion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal: list[tuple[Any, ...]] = []
    a, broken, b = Recorder("a", journal), Recorder("x", journal, fail=True), Recorder("b", journal)
    assert isinstance(a, ResponseStreaming)
    d = director([a, broken, b])
    ex = routed(stream=True)
    d.on_response_headers(ex, {":status": "200", "content-type": SSE}, "")
    created = event("response.created", response={"id": "resp_1", "status": "in_progress"})
    with caplog.at_level(logging.ERROR):
        first = d.on_response_chunk(ex, created, False, hold_limit=None)
    assert first is not None and first.body == created  # the stream goes on
    assert journal == [("a", "resp_1", False), ("x", "resp_1", False), ("b", "resp_1", False)]
    assert "response-streaming hook x/recorder failed" in caplog.text
    journal.clear()
    d.on_response_chunk(ex, event("response.output_text.delta", delta="hi"), False, hold_limit=None)
    d.on_response_chunk(ex, b"data: [DONE]\n\n", True, hold_limit=None)
    assert journal == [
        ("a", "resp_1", False), ("x", "resp_1", False), ("b", "resp_1", False),
        ("a", "resp_1", True), ("x", "resp_1", True), ("b", "resp_1", True),
        ("a", "complete"), ("x", "complete"), ("b", "complete"),
    ]  # fmt: skip


def test_a_held_response_gives_the_hooks_one_call_at_its_end() -> None:
    journal: list[tuple[Any, ...]] = []
    d = director([Recorder("a", journal)])
    ex = routed(stream=False)
    d.on_response_headers(ex, {":status": "200", "content-type": "application/json"}, "")
    body = json.dumps({"object": "response", "id": "resp_2"}).encode()
    assert d.on_response_chunk(ex, body[:10], False, hold_limit=None) is None
    assert journal == []
    d.on_response_chunk(ex, body[10:], True, hold_limit=None)
    assert journal == [("a", "resp_2", True), ("a", "complete")]


def test_an_unrouted_exchange_runs_no_hook() -> None:
    journal: list[tuple[Any, ...]] = []
    d = director([Recorder("a", journal)])
    ex = Exchange(make_request(), started=0.0)
    d.on_response_headers(ex, {":status": "200", "content-type": SSE}, "")
    d.on_response_chunk(ex, event("response.created", response={"id": "r"}), True, hold_limit=None)
    assert journal == []
