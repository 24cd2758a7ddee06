"""The Director: owns one request from its headers to its completion.

Request side (spec §5.3): parse → target model → objective/priority → admission (flow control,
or legacy shedding) → candidates (pool ∩ subset hint, less what a ``CandidateNarrower`` detector
excludes) → screeners (the candidates every one keeps; ``Scheduler.screen``) → producers →
admitters → scheduler → conditional-decode gate (``exchange``) → pre-request
hooks. Failures: ``InferenceError``.

A request that arrives before the first discovery sync (a restarted EPP accepts on its ext_proc
port before its endpoints are known) waits for that sync, up to ``DISCOVERY_WAIT`` seconds,
rather than failing with a 503 on an empty pool. Once the server has sent the routed body on,
``sent`` drops the request's content (its body, its token ids); the response side sees the rest.

Response side (``epp.requestcontrol.responses``, which the Director builds on): the response
headers, body chunks and trailers, and completion, exactly once.

Target model: ``epp.requestcontrol.rewrites.target_model``. With tracing, the parse, admission,
profile and plugin timings go to the request's trace (``epp.observability.tracing``).

Metric labels (``epp.observability.labels``): the Director tells its ``RequestStats`` which model
names the pool serves (the LoRA adapters the endpoints' scraped metrics list, the rewrite objects'
model names) and which ones a model server confirmed with a 2xx response; any other name a client
sends is counted under ``unknown``.

The ext_proc server (``epp.server``) only translates protocol messages into these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import types
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from typing import Any

from epp.config.pipeline import Pipeline
from epp.flowcontrol.controller import FlowController
from epp.observability.decisions import DecisionLog
from epp.observability.logs import fields as _kv
from epp.observability.recorder import RequestStats
from epp.observability.tracing import TRACE_KEY, RequestTrace
from epp.plugin import (
    DEFAULT_FAIRNESS_ID,
    CandidateNarrower,
    CycleState,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Parser,
    ParseResult,
    agent_identity,
    release_content,
    wire,
)
from epp.plugin.spans import SPAN_SINK
from epp.requestcontrol.exchange import (
    Decision,
    Exchange,
    Forward,
    conditional_decode,
    no_candidates,
)
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.parsers import ParserRouter
from epp.requestcontrol.responses import ResponseSide
from epp.requestcontrol.rewrites import RewriteStore, served_models, target_model
from epp.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

__all__ = ["DISCOVERY_WAIT", "Decision", "Director", "Exchange", "Forward"]

DISCOVERY_WAIT = 5.0
"""Seconds a request may wait for the first discovery sync: well past a file's first read or a
Kubernetes list, well under a client's patience; after it the request gets the empty pool's 503."""


class Director(ResponseSide):
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
        response_sample: float = 1.0,
        sample_rng: random.Random | None = None,
        discovered: asyncio.Event | None = None,
        discovery_wait: float = DISCOVERY_WAIT,
    ) -> None:
        super().__init__(
            pipeline, flow, stats, response_sample=response_sample, sample_rng=sample_rng
        )
        self._scheduler = scheduler
        self._endpoints = endpoints
        self._objectives = objectives
        self._clock = clock
        self._rng = rng or random.Random()
        self._subset_filter = subset_filter
        narrower = pipeline.saturation_detector
        self._narrower = narrower if isinstance(narrower, CandidateNarrower) else None
        self._router = ParserRouter(pipeline.parsers)
        self._discovered, self._discovery_wait = discovered, discovery_wait
        self._producers = tuple(zip(pipeline.producers, pipeline.producer_timeouts, strict=True))
        self._screeners = tuple(pipeline.screeners)
        self._header_processors = tuple(pipeline.request_header)
        self._on_scheduled = on_scheduled or (lambda _: None)
        self._rewrites = rewrites if rewrites is not None else RewriteStore()
        self._rewriting = (self._rewrites, self._rng, on_rewrite or (lambda _n, _m, _t: None))
        self.decisions = decisions if decisions is not None else DecisionLog()
        if stats is not None:
            stats.serve_models_from(self.pool_models)

    @property
    def flow_controlled(self) -> bool:
        """Routing may wait in a flow-control queue (the ``flowControl`` gate is on)."""
        return self._flow is not None

    def pool_models(self) -> list[str]:
        """Model names the pool serves by its own account (``rewrites.served_models``)."""
        return served_models(self._endpoints(), self._rewrites)

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
                log.exception("request-header processor failed", extra=_kv(request, processor))
        if not fairness and self._header_processors:
            request.fairness_id = agent_identity(request) or DEFAULT_FAIRNESS_ID
        return request

    def begin(self, headers: Mapping[str, str]) -> Exchange:
        """A request's headers arrived: the exchange the rest of its life is tracked in."""
        return Exchange(self.new_request(headers), started=time.monotonic())

    def candidates(self, metadata: Mapping[str, Any]) -> Sequence[Endpoint]:
        """Pool endpoints, narrowed by the subset hint (IP match, spec §1.5) and the narrower."""
        pool = self._endpoints()
        if self._subset_filter:
            subset = wire.subset_hint(metadata)
            if subset is not None:
                ips = {wire.host_of(entry) for entry in subset}
                pool = [e for e in pool if e.address in ips]
        if self._narrower is not None and pool:
            pool = self._narrower.routable(self._clock(), pool)
        return pool

    def pick_random(
        self, metadata: Mapping[str, Any], request: InferenceRequest | None = None
    ) -> Endpoint:
        """Header-only requests: a uniformly random endpoint (subset hint honoured) among those
        the screeners keep for ``request``."""
        pool = self.candidates(metadata)
        if not pool:
            if wire.subset_hint(metadata) is not None:
                raise no_candidates()
            raise InferenceError(ErrorCode.INTERNAL, "no pods available in datastore")
        if self._screeners and request is not None:
            pool = self._screen(request, pool, None)
        return self._rng.choice(list(pool))

    async def route(self, ex: Exchange, body: bytes, metadata: Mapping[str, Any]) -> Decision:
        """The whole body arrived: decide, and record the decision (metrics, explain view)."""
        t0 = time.perf_counter()
        if self.discovering:
            await self.first_discovery()
        decision = await self.decide(ex.request, body, metadata, ex.trace)
        ex.decision = decision
        if self._stats is not None:
            self._stats.on_scheduled(decision.request, decision.result)
        self.decisions.record(
            decision.request, decision.result, decision.candidates, time.perf_counter() - t0
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request scheduled", extra=_kv(ex.request, endpoint=decision.destination))
        return decision

    @property
    def discovering(self) -> bool:
        """The first discovery sync has not happened yet (a request should ``first_discovery``)."""
        return self._discovered is not None and not self._discovered.is_set()

    async def first_discovery(self) -> None:
        """Wait for the first discovery sync, at most ``discovery_wait`` seconds; a request still
        early after that goes on, and an empty pool answers it (503, logged as failed)."""
        if self._discovered is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._discovered.wait(), self._discovery_wait)

    @staticmethod
    def sent(ex: Exchange) -> None:
        """The routed body has gone to Envoy: drop what the request no longer needs, so a
        request holds a few kilobytes, not its prompt, while its answer streams: the body to
        forward goes, and the request's content (``epp.plugin.routed``)."""
        decision = ex.decision
        if decision is None:
            return
        decision.body = b""
        release_content(ex.request)

    def fail(self, ex: Exchange | None, err: InferenceError) -> None:
        """The request is answered with ``err`` instead of being routed."""
        request = ex.request if ex is not None else None
        if self._stats is not None:
            self._stats.on_error(request, err.code.label)
        self.decisions.record_error(request, err.code.http_status, err.body, err.drop_reason)
        if err.code.http_status >= 500:
            log.warning("request failed", extra=_kv(request, reason=str(err)))

    def protocol_error(self, reason: str) -> None:
        """The data plane broke the ext_proc protocol on one stream (``epp.server.misuse``)."""
        if self._stats is not None:
            self._stats.on_protocol_error(reason)

    async def decide(
        self,
        request: InferenceRequest,
        body: bytes,
        metadata: Mapping[str, Any],
        trace: RequestTrace | None = None,
        *,
        dry_run: bool = False,
    ) -> Decision:
        """``dry_run``: no admission, admitters or pre-request hooks (the admin API's Explain)."""
        t0 = time.time_ns()
        path, parser = self._router.resolve(request.headers)
        request.path = path
        parsed = parser.parse_request(path, body, request.headers)
        request.body = parsed.body
        request.size_bytes = len(body)
        request.incoming_model = parsed.model
        out_body = target_model(request, parser, parsed, body, *self._rewriting)
        t1 = time.time_ns()
        if trace is not None:
            trace.phase("llm_d.epp.parse", t0, t1, **{"llm_d.epp.parser": str(parser.typed_name)})
        if dry_run:
            return await self._schedule(request, parser, parsed, out_body, metadata, trace, True)
        try:
            await self._admit(request)
        finally:
            if trace is not None:
                trace.phase("llm_d.epp.admission", t1, time.time_ns())
        try:
            return await self._schedule(request, parser, parsed, out_body, metadata, trace)
        except BaseException:
            if self._flow is not None:
                self._flow.done(request)
            raise

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
        trace: RequestTrace | None,
        dry_run: bool = False,
    ) -> Decision:
        pool = self.candidates(metadata)
        if not pool:
            raise no_candidates()
        if trace is not None and trace.recording:
            request.attributes[SPAN_SINK] = trace  # plugins' spans (epp.plugin.spans)
        if self._screeners:
            pool = self._screen(request, pool, trace)
        if self._producers:
            await self._produce(request, pool, trace)
        cycle = CycleState(now=self._clock(), rng=self._rng)
        if trace is not None:
            cycle.data[TRACE_KEY] = trace
        for admitter in () if dry_run else self._pipeline.admitters:
            denial = admitter.admit(cycle, request, pool)
            if denial is not None:
                raise denial
        t0 = time.perf_counter()
        result = self._scheduler.schedule(cycle, request, pool)
        self._on_scheduled(time.perf_counter() - t0)
        conditional_decode(request, result)  # ``Prefer: if-available``: 412 without a cached prefix
        for hook in () if dry_run else self._pipeline.pre_request:
            try:
                hook.pre_request(request, result)
            except Exception:
                log.exception("pre-request hook failed", extra=_kv(request, hook))
        destination = ",".join(e.hostport for e in result.primary.targets)
        return Decision(request, result, parser, parsed, out_body, destination, pool)

    def _screen(
        self, request: InferenceRequest, pool: Sequence[Endpoint], trace: RequestTrace | None
    ) -> Sequence[Endpoint]:
        cycle = CycleState(now=self._clock(), rng=self._rng)
        if trace is not None:
            cycle.data[TRACE_KEY] = trace
        return self._scheduler.screen(cycle, request, pool, self._screeners)

    async def _produce(
        self, request: InferenceRequest, pool: Sequence[Endpoint], trace: RequestTrace | None
    ) -> None:
        for producer, timeout in self._producers:
            t0 = time.perf_counter()
            try:
                await _bounded(producer.produce(request, pool), timeout)
            except Exception as exc:  # upstream: producer failures are logged, request goes on
                log.warning("data producer failed", extra=_kv(request, producer, reason=repr(exc)))
            if trace is not None:
                trace.plugin("DataProducer", producer.typed_name, time.perf_counter() - t0)


async def _bounded(coro: Awaitable[None], timeout: float) -> None:
    """Await a producer's ``produce`` with its timeout; the timer is only armed if the coroutine
    waits. Most producers never do (hashing, matching, reading attributes), and a timeout can only
    end a coroutine at an ``await``, so one that finishes on its first step is done exactly as it
    would be under the timer, without the timer's cost (about a tenth of the producers' time on a
    small request). The deadline still counts from the start."""
    deadline = asyncio.get_running_loop().time() + timeout
    if type(coro) is not types.CoroutineType and not isinstance(coro, Coroutine):
        async with asyncio.timeout_at(deadline):  # a ``produce`` that returns another awaitable
            await coro
        return
    try:
        waiting = coro.send(None)
    except StopIteration:
        return
    async with asyncio.timeout_at(deadline):
        await _resumed(coro, waiting)


@types.coroutine
def _resumed(coro: Coroutine[Any, Any, None], waiting: Any) -> Generator[Any, Any, None]:
    """The rest of ``coro`` after the step that yielded ``waiting``, driven as a task drives it:
    what it waits on goes up to the task, a cancellation (the timeout's, or the request's) goes
    down into it."""
    try:
        while True:
            try:
                yield waiting
            except GeneratorExit:  # this wrapper is being closed: ``finally`` closes the coroutine
                raise
            except BaseException as exc:  # handed to the coroutine, as a task does
                waiting = coro.throw(exc)
            else:
                waiting = coro.send(None)
    except StopIteration:
        return
    finally:
        coro.close()  # no-op once it ended; ends it if this wrapper is closed half-way
