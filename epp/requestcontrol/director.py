"""The director: from a complete request (headers + body) to a scheduling decision.

Order (spec §5.3): parse → target model → objective/priority → legacy admission → candidates
(pool ∩ subset hint) → data producers → admitters → scheduler → pre-request hooks. Every failure
is an ``InferenceError`` carrying its wire status.

Target model (spec §1.7): the ``x-llm-d-model-name-rewrite`` header if present, else the body's
model; then an InferenceModelRewrite rule matching the *incoming* (body) model overrides it (a
generic rule also catches a missing model, for parsers that can rewrite the body), the target
drawn by weight from the director's random source; each such decision is reported to
``on_rewrite(rewrite_name, incoming_model, target_model)``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from epp.config.pipeline import Pipeline
from epp.flowcontrol.controller import FlowController
from epp.plugin import (
    CycleState,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    Parser,
    ParseResult,
    SchedulingResult,
    wire,
)
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.parsers import ParserRouter
from epp.requestcontrol.rewrites import RewriteStore
from epp.scheduling.scheduler import Scheduler

log = logging.getLogger(__name__)

PRODUCER_TIMEOUT = 0.4  # upstream's per-producer default


@dataclass(slots=True)
class Decision:
    request: InferenceRequest
    result: SchedulingResult
    parser: Parser
    parsed: ParseResult
    body: bytes
    destination: str
    candidates: Sequence[Endpoint]

    @property
    def model_rewritten(self) -> bool:
        return self.request.target_model != self.request.incoming_model


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
        self._on_scheduled = on_scheduled or (lambda _: None)
        self._rewrites = rewrites if rewrites is not None else RewriteStore()
        self._on_rewrite = on_rewrite or (lambda _n, _m, _t: None)

    def new_request(self, headers: Mapping[str, str]) -> InferenceRequest:
        request_id = headers.get("x-request-id") or str(uuid.uuid4())
        fairness = wire.first_header(headers, wire.FAIRNESS_HEADERS)
        objective = wire.first_header(headers, wire.OBJECTIVE_HEADERS)
        return InferenceRequest(
            request_id=request_id,
            headers=headers,
            objective=objective,
            priority=self._objectives.priority(objective),
            fairness_id=fairness or wire.DEFAULT_FAIRNESS_ID,
            received_at=self._clock(),
        )

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

    async def decide(
        self, request: InferenceRequest, body: bytes, metadata: Mapping[str, Any]
    ) -> Decision:
        path, parser = self._router.resolve(request.headers)
        request.path = path
        parsed = parser.parse_request(path, body, request.headers)
        request.body = parsed.body
        request.size_bytes = len(body)
        request.incoming_model = parsed.model
        target = wire.first_header(request.headers, wire.MODEL_REWRITE_HEADERS)
        request.target_model = target or parsed.model
        if len(self._rewrites) and (parsed.model or parser.supports_model_rewrite):
            decision = self._rewrites.resolve(parsed.model, self._rng)
            if decision is not None:
                request.target_model = decision.target_model
                self._on_rewrite(decision.rewrite_name, parsed.model, decision.target_model)
        out_body = body
        if parser.supports_model_rewrite and parsed.body.payload is not None:
            if not request.target_model:
                raise InferenceError(ErrorCode.BAD_REQUEST, "model not found in request body")
            if request.target_model != parsed.model:
                out_body = parser.rewrite_model(parsed.body, request.target_model)

        await self._admit(request)
        try:
            return await self._schedule(request, parser, parsed, out_body, metadata)
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
    ) -> Decision:
        pool = self.candidates(metadata)
        if not pool:
            raise _no_candidates()
        if self._pipeline.producers:
            await self._produce(request, pool)
        cycle = CycleState(now=self._clock(), rng=self._rng)
        for admitter in self._pipeline.admitters:
            denial = admitter.admit(cycle, request, pool)
            if denial is not None:
                raise denial
        t0 = time.perf_counter()
        result = self._scheduler.schedule(cycle, request, pool)
        self._on_scheduled(time.perf_counter() - t0)
        for hook in self._pipeline.pre_request:
            try:
                hook.pre_request(request, result)
            except Exception:
                log.exception("pre-request hook %s failed", hook.typed_name)
        destination = ",".join(e.hostport for e in result.primary.targets)
        return Decision(request, result, parser, parsed, out_body, destination, pool)

    def finished(self, request: InferenceRequest, output_tokens: int = 0) -> None:
        """A scheduled request completed (any cause): frees its flow-control accounting."""
        if self._flow is not None:
            self._flow.done(request, output_tokens=output_tokens)

    async def _produce(self, request: InferenceRequest, pool: Sequence[Endpoint]) -> None:
        for producer in self._pipeline.producers:
            timeout = getattr(producer, "produce_timeout", None)
            try:
                async with asyncio.timeout(timeout() if timeout else PRODUCER_TIMEOUT):
                    await producer.produce(request, pool)
            except Exception as exc:  # upstream: producer failures are logged, request goes on
                log.warning("data producer %s failed: %r", producer.typed_name, exc)


def _no_candidates() -> InferenceError:
    return InferenceError(
        ErrorCode.SERVICE_UNAVAILABLE,
        "failed to find endpoint candidates for serving the request",
        drop_reason=DropReason.NO_ENDPOINTS,
    )
