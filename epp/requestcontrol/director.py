"""The Director: owns one request from its headers to its completion.

Request side (spec §5.3): parse → target model → objective/priority → admission (flow control,
or legacy shedding) → candidates (pool ∩ subset hint) → data producers → admitters → scheduler →
pre-request hooks. Every failure is an ``InferenceError`` carrying its wire status.

Response side: the response headers run the ``ResponseHeaders`` hooks; body chunks feed the
parser's usage extraction and get the client's model name back; completion (end of stream,
trailers, client disconnect or error, exactly once) runs the ``ResponseComplete`` hooks, frees the
flow-control accounting and records the request's metrics.

Target model (spec §1.7): the ``x-llm-d-model-name-rewrite`` header if present, else the body's
model; then an InferenceModelRewrite rule matching the *incoming* (body) model overrides it (a
generic rule also catches a missing model, for parsers that can rewrite the body), the target
drawn by weight from the director's random source; each such decision is reported to
``on_rewrite(rewrite_name, incoming_model, target_model)``.

Metric labels (``epp.observability.labels``): the Director tells its ``RequestStats`` which model
names the pool serves (the LoRA adapters the endpoints' scraped metrics list, the rewrite objects'
model names) and which ones a model server confirmed with a 2xx response; any other name a client
sends is counted under ``unknown``.

The ext_proc server (``epp.server``) only translates protocol messages into these calls.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from epp.config.pipeline import Pipeline
from epp.flowcontrol.controller import FlowController
from epp.observability.decisions import DecisionLog
from epp.observability.recorder import RequestStats
from epp.plugin import (
    DEFAULT_FAIRNESS_ID,
    CycleState,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Parser,
    ParseResult,
    ResponseInfo,
    TerminationCause,
    agent_identity,
    wire,
)
from epp.requestcontrol.exchange import Decision, Exchange, Forward, learn, restore_model
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.parsers import ParserRouter
from epp.requestcontrol.rewrites import RewriteStore
from epp.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = ["Decision", "Director", "Exchange", "Forward"]


class Director:
    def __init__(
        self,
        *,
        pipeline: Pipeline,
        scheduler: Scheduler,
        endpoints: Callable[[], Sequence[Endpoint]],
        objectives: ObjectiveStore,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        subset_filter: bool = True,
        on_scheduled: Callable[[float], None] | None = None,
        rewrites: RewriteStore | None = None,
        on_rewrite: Callable[[str, str, str], None] | None = None,
        flow: FlowController | None = None,
        stats: RequestStats | None = None,
        decisions: DecisionLog | None = None,
    ) -> None:
        self._flow = flow
        self._pipeline = pipeline
        self._scheduler = scheduler
        self._endpoints = endpoints
        self._objectives = objectives
        self._clock = clock
        self._rng = rng or random.Random()
        self._subset_filter = subset_filter
        self._router = ParserRouter(pipeline.parsers)
        self._producers = tuple(zip(pipeline.producers, pipeline.producer_timeouts, strict=True))
        self._header_processors = tuple(pipeline.request_header)
        self._on_scheduled = on_scheduled or (lambda _: None)
        self._rewrites = rewrites if rewrites is not None else RewriteStore()
        self._on_rewrite = on_rewrite or (lambda _n, _m, _t: None)
        self._stats = stats
        self.decisions = decisions if decisions is not None else DecisionLog()
        if stats is not None:
            stats.serve_models_from(self.pool_models)

    def pool_models(self) -> list[str]:
        """Model names the pool serves by its own account: LoRA adapters the endpoints' metrics
        list as running or waiting, and every model an InferenceModelRewrite names."""
        names: list[str] = []
        for endpoint in self._endpoints():
            if endpoint.metrics is not None:
                names += endpoint.metrics.active_models
                names += endpoint.metrics.waiting_models
        for rewrite in self._rewrites.rewrites():
            for rule in rewrite.rules:
                names += rule.models
                names += (target.model for target in rule.targets)
        return names

    # ---- request side -------------------------------------------------------------------------

    def new_request(self, headers: Mapping[str, str]) -> InferenceRequest:
        """The request as its headers describe it. RequestHeader processors run here (one that
        raises is logged and skipped); the fairness id is the fairness header, else the
        ``agent-identity`` attribute a processor published, else ``default-flow`` (spec §5.3)."""
        request_id = headers.get(wire.REQUEST_ID_HEADER) or str(uuid.uuid4())
        fairness = wire.first_header(headers, wire.FAIRNESS_HEADERS)
        objective = wire.first_header(headers, wire.OBJECTIVE_HEADERS)
        request = InferenceRequest(
            request_id=request_id,
            headers=headers,
            objective=objective,
            priority=self._objectives.priority(objective),
            fairness_id=fairness or DEFAULT_FAIRNESS_ID,
            received_at=self._clock(),
        )
        for processor in self._header_processors:
            try:
                processor.request_header(request)
            except Exception:
                log.exception("request-header processor %s failed", processor.typed_name)
        if not fairness and self._header_processors:
            request.fairness_id = agent_identity(request) or DEFAULT_FAIRNESS_ID
        return request

    def begin(self, headers: Mapping[str, str]) -> Exchange:
        """A request's headers arrived: the exchange the rest of its life is tracked in."""
        return Exchange(self.new_request(headers), started=time.monotonic())

    def candidates(self, metadata: Mapping[str, Any]) -> Sequence[Endpoint]:
        """Pool endpoints, narrowed by the data plane's subset hint (IP match, spec §1.5)."""
        pool = self._endpoints()
        if not self._subset_filter:
            return pool
        subset = wire.subset_hint(metadata)
        if subset is None:
            return pool
        ips = {wire.host_of(entry) for entry in subset}
        return [e for e in pool if e.address in ips]

    def pick_random(self, metadata: Mapping[str, Any]) -> Endpoint:
        """Header-only requests: a uniformly random endpoint (subset hint honoured)."""
        pool = self.candidates(metadata)
        if not pool:
            if wire.subset_hint(metadata) is not None:
                raise _no_candidates()
            raise InferenceError(ErrorCode.INTERNAL, "no pods available in datastore")
        return self._rng.choice(list(pool))

    async def route(self, ex: Exchange, body: bytes, metadata: Mapping[str, Any]) -> Decision:
        """The whole body arrived: decide, and record the decision (metrics, explain view)."""
        t0 = time.perf_counter()
        decision = await self.decide(ex.request, body, metadata)
        ex.decision = decision
        if self._stats is not None:
            self._stats.on_scheduled(decision.request, decision.result)
        self.decisions.record(
            decision.request, decision.result, decision.candidates, time.perf_counter() - t0
        )
        return decision

    def fail(self, ex: Exchange | None, err: InferenceError) -> None:
        """The request is answered with ``err`` instead of being routed."""
        request = ex.request if ex is not None else None
        if self._stats is not None:
            self._stats.on_error(request, err.code.label)
        self.decisions.record_error(request, err.code.http_status, err.body, err.drop_reason)
        if err.code.http_status >= 500:
            log.warning("request %s failed: %s", request and request.request_id, err)

    def protocol_error(self, reason: str) -> None:
        """The data plane broke the ext_proc protocol on one stream (``epp.server.misuse``)."""
        if self._stats is not None:
            self._stats.on_protocol_error(reason)

    async def decide(
        self,
        request: InferenceRequest,
        body: bytes,
        metadata: Mapping[str, Any],
        *,
        dry_run: bool = False,
    ) -> Decision:
        """``dry_run``: no admission, admitters or pre-request hooks (the admin API's Explain)."""
        path, parser = self._router.resolve(request.headers)
        request.path = path
        parsed = parser.parse_request(path, body, request.headers)
        request.body = parsed.body
        request.size_bytes = len(body)
        request.incoming_model = parsed.model
        out_body = self._target_model(request, parser, parsed, body)
        if dry_run:
            return await self._schedule(request, parser, parsed, out_body, metadata, dry_run)
        await self._admit(request)
        try:
            return await self._schedule(request, parser, parsed, out_body, metadata)
        except BaseException:
            if self._flow is not None:
                self._flow.done(request)
            raise

    def _target_model(
        self, request: InferenceRequest, parser: Parser, parsed: ParseResult, body: bytes
    ) -> bytes:
        """Sets ``request.target_model``; returns the body to forward (rewritten if needed)."""
        target = wire.first_header(request.headers, wire.MODEL_REWRITE_HEADERS)
        request.target_model = target or parsed.model
        if len(self._rewrites) and (parsed.model or parser.supports_model_rewrite):
            decision = self._rewrites.resolve(parsed.model, self._rng)
            if decision is not None:
                request.target_model = decision.target_model
                self._on_rewrite(decision.rewrite_name, parsed.model, decision.target_model)
        if parser.supports_model_rewrite and parsed.body.payload is not None:
            if not request.target_model:
                raise InferenceError(ErrorCode.BAD_REQUEST, "model not found in request body")
            if request.target_model != parsed.model:
                return parser.rewrite_model(parsed.body, request.target_model)
        return body

    async def _admit(self, request: InferenceRequest) -> None:
        """Flow control (gate on) queues the request until dispatch or rejection; legacy
        admission (gate off) sheds only sheddable requests, and only at saturation >= 1."""
        if self._flow is not None:
            await self._flow.admit(request, self._endpoints)
        elif request.priority < 0:
            sat = self._pipeline.saturation_detector.saturation(self._clock(), self._endpoints())
            if sat >= 1.0:
                raise InferenceError(
                    ErrorCode.RESOURCE_EXHAUSTED, "system saturated, sheddable request dropped"
                )

    async def _schedule(
        self,
        request: InferenceRequest,
        parser: Parser,
        parsed: ParseResult,
        out_body: bytes,
        metadata: Mapping[str, Any],
        dry_run: bool = False,
    ) -> Decision:
        pool = self.candidates(metadata)
        if not pool:
            raise _no_candidates()
        if self._producers:
            await self._produce(request, pool)
        cycle = CycleState(now=self._clock(), rng=self._rng)
        for admitter in () if dry_run else self._pipeline.admitters:
            denial = admitter.admit(cycle, request, pool)
            if denial is not None:
                raise denial
        t0 = time.perf_counter()
        result = self._scheduler.schedule(cycle, request, pool)
        self._on_scheduled(time.perf_counter() - t0)
        for hook in () if dry_run else self._pipeline.pre_request:
            try:
                hook.pre_request(request, result)
            except Exception:
                log.exception("pre-request hook %s failed", hook.typed_name)
        destination = ",".join(e.hostport for e in result.primary.targets)
        return Decision(request, result, parser, parsed, out_body, destination, pool)

    async def _produce(self, request: InferenceRequest, pool: Sequence[Endpoint]) -> None:
        for producer, timeout in self._producers:
            try:
                async with asyncio.timeout(timeout):
                    await producer.produce(request, pool)
            except Exception as exc:  # upstream: producer failures are logged, request goes on
                log.warning("data producer %s failed: %r", producer.typed_name, exc)

    # ---- response side ------------------------------------------------------------------------

    def on_response_headers(
        self, ex: Exchange, headers: Mapping[str, str], served_endpoint: str
    ) -> dict[str, str]:
        """The model server answered: returns the headers to set on the response."""
        status = headers.get(":status", "200")
        decision = ex.decision
        streaming = "text/event-stream" in headers.get("content-type", "") or bool(
            decision and decision.parsed.body.stream
        )
        ex.response = ResponseInfo(
            request_id=ex.request.request_id,
            headers=headers,
            served_endpoint=served_endpoint,
            streaming=streaming,
            status=int(status) if status.isdigit() else 0,
        )
        if streaming and decision is not None:
            ex.state = decision.parser.new_response_state(headers)
        elif not streaming:
            ex.buffer = bytearray()
        if self._stats is not None:
            self._stats.on_response_status(ex.request, ex.response.status)
            if not status.startswith("2"):
                self._stats.on_error(ex.request, "ModelServerError")
        set_headers = {wire.WENT_INTO_RESP_HEADERS: "true"}
        for hook in self._pipeline.response_headers:
            try:
                hook.response_headers(ex.request, ex.response, set_headers)
            except Exception:
                log.exception("response-headers hook %s failed", hook.typed_name)
        return set_headers

    def on_response_chunk(
        self, ex: Exchange, data: bytes, end_of_stream: bool, *, hold_limit: int | None
    ) -> Forward | None:
        """A response body chunk. Streamed responses pass through at once; a non-streamed one is
        held until its end to parse its usage (``None`` = held), unless it grows past
        ``hold_limit`` bytes, in which case it passes through from then on."""
        if ex.response is None:  # response body without headers (response_header_mode SKIP)
            ex.response = ResponseInfo(request_id=ex.request.request_id, headers={})
            ex.buffer = bytearray()
        if not ex.first_byte_at:
            ex.first_byte_at = time.monotonic()
            if self._stats is not None:
                seconds = ex.first_byte_at - ex.started
                self._stats.on_first_byte(ex.request, seconds, ex.response.streaming)
        ex.size += len(data)
        held = ex.buffer
        if held is not None and (hold_limit is None or len(held) + len(data) <= hold_limit):
            held += data
            return self._release(ex) if end_of_stream else None
        if held:  # a held response grew past the limit: send what was held first
            data = bytes(held) + data
        ex.buffer = None
        if ex.state is not None:
            learn(ex.response, ex.state.feed(data, end_of_stream))
        out = restore_model(ex.decision, data)
        if end_of_stream:
            self.complete(ex, TerminationCause.NATURAL)
        return Forward(out, whole=False, changed=out is not data)

    def on_response_trailers(self, ex: Exchange) -> Forward | None:
        """Trailers end the response: a held body is released, and the request completes."""
        forward = self._release(ex) if ex.buffer is not None else None
        self.complete(ex, TerminationCause.NATURAL)
        return forward

    def _release(self, ex: Exchange) -> Forward:
        """Let a held response go: its usage parsed at once, the model name restored."""
        assert ex.buffer is not None and ex.response is not None
        body = bytes(ex.buffer)
        ex.buffer = None
        decision = ex.decision
        if decision is not None:
            parsed = decision.parser.parse_response(
                body, ex.response.headers, streaming=False, end_of_stream=True
            )
            learn(ex.response, parsed)
        out = restore_model(decision, body)
        self.complete(ex, TerminationCause.NATURAL)
        return Forward(out, whole=True, changed=out != body)

    def complete(self, ex: Exchange, cause: TerminationCause) -> None:
        """The request ended (any cause). Runs once, and only for a routed request."""
        if ex.completed or ex.decision is None:
            return
        ex.completed = True
        request = ex.request
        info = ex.response or ResponseInfo(request_id=request.request_id, headers={})
        info.end_of_stream = True
        info.termination_cause = cause
        for hook in self._pipeline.response_complete:
            try:
                hook.response_complete(request, info)
            except Exception:
                log.exception("response-complete hook %s failed", hook.typed_name)
        if self._flow is not None:
            self._flow.done(request, output_tokens=info.usage.completion_tokens)
        if self._stats is not None:
            self._stats.on_complete(request, info, time.monotonic() - ex.started, ex.size)


def _no_candidates() -> InferenceError:
    return InferenceError(
        ErrorCode.SERVICE_UNAVAILABLE,
        "failed to find endpoint candidates for serving the request",
        drop_reason=DropReason.NO_ENDPOINTS,
    )
