"""The flow controller: requests wait in the EPP, by band and flow, until the pool has room.

Enabled by the ``flowControl`` feature gate (spec §8). ``admit`` enqueues a request in the flow
``(fairness_id, band priority)`` and returns once it is dispatched, or raises the
``InferenceError`` of its outcome. One dispatch cycle (``step``; ``run`` calls it every
millisecond while requests wait, ``admit`` once per arrival) does::

    for each band, highest priority first:
        flow = band.fairness.select_flow(band)       # None: nothing waits here, next band
        head = that flow's head under band.ordering
        saturation = detector over the head's candidates (max of the prefill and decode
                     role partitions, see epp.flowcontrol.saturation)
        ceilings = usage_limit.compute_limit(saturation, provisioned priorities)  # once
        if saturation >= ceilings[band]: stop         # head-of-line blocking, no inversion
        dispatch head; stop

so at most one request leaves per cycle. "Candidates" is the callable given to ``admit``, read
again at every cycle and sweep. Pass the whole pool to gate on pool saturation exactly as upstream
(the director's own candidate check then answers an unmatched subset hint with 503 right after
dispatch); a callable narrowed by the subset hint instead keeps such a request waiting, as in an
empty pool, until ``noEndpointRequestTTL``, and can hold up its band meanwhile.

A sweep (once a second, and whenever a known deadline is due) evicts requests whose queue-wait
budget ran out: ``defaultRequestTTL`` while they have candidate endpoints,
``noEndpointRequestTTL`` while they have none, each charged from the later of enqueue and the last
change between the two.

Outcomes (metric label → wire):

- ``Dispatched`` → ``admit`` returns; call ``done`` when the request is finished.
- ``RejectedCapacity`` (band or global cap full) → 429 ``rejected-saturated``.
- ``RejectedNoEndpoints`` (cap full and no candidates) → 503 ``rejected-no-endpoints``.
- ``EvictedTTL`` → 429 ``rejected-ttl-expired`` (503 ``rejected-no-endpoints`` if the request has
  no candidates by then); ``EvictedNoEndpoints`` → 503 ``rejected-no-endpoints``.
- ``EvictedContextCancelled``: the awaiting task was cancelled (client gone); its slot is freed at
  once and the cancellation propagates.
- ``RejectedOther``/``EvictedOther`` at shutdown → 503 ``rejected-shutting-down``.

Priority adjusters (e.g. ``turn-priority``) may move a request to a higher band; the request's
own ``priority`` is left as is.

Across EPP replicas the controller is a ``epp.plugin.SharedState`` (``typed_name``
``flow-control``): it shares its per-band queue occupancy, exposes the pool-wide view in metrics
and, only when ``CrossReplicaOptions`` asks, gates on it (``epp.flowcontrol.shared``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry

from epp.config.schema import FlowControlSpec
from epp.flowcontrol.config import FlowControlConfig, resolve_config
from epp.flowcontrol.eviction import InFlight, Reclaimer
from epp.flowcontrol.metrics import FlowControlMetrics, ModelLabelPolicy
from epp.flowcontrol.outcomes import (
    DISPATCHED,
    EVICTED_CONTEXT_CANCELLED,
    EVICTED_NO_ENDPOINTS,
    EVICTED_OTHER,
    EVICTED_TTL,
    NOT_YET_FINALIZED,
    REJECTED_CAPACITY,
    REJECTED_NO_ENDPOINTS,
    REJECTED_OTHER,
    outcome_error,
)
from epp.flowcontrol.queues import Band
from epp.flowcontrol.saturation import SaturationReader, band_ceilings, confirmation_grace
from epp.flowcontrol.shared import FLOW_CONTROL_NAME, CrossReplicaOptions, PeerOccupancy
from epp.plugin import (
    DEFAULT_FAIRNESS_ID,
    Endpoint,
    InferenceRequest,
    ReservingDetector,
    SaturationDetector,
)
from epp.plugin.flow import FairnessPolicy, QueuedRequest, prompt_tokens

log = logging.getLogger(__name__)

DISPATCH_TICK: Final = 0.001
SWEEP_INTERVAL: Final = 1.0
BAND_GC_TIMEOUT: Final = 600.0


class FlowController:
    def __init__(
        self,
        config: FlowControlConfig,
        *,
        detector: SaturationDetector,
        metrics: FlowControlMetrics,
        clock: Callable[[], float],
        cross_replica: CrossReplicaOptions | None = None,
    ) -> None:
        self.typed_name = FLOW_CONTROL_NAME
        self._config = config
        self._reserving = detector if isinstance(detector, ReservingDetector) else None
        self._reader = SaturationReader(detector, metrics)
        self._metrics = metrics
        self._clock = clock
        self._bands = {priority: Band(priority, cfg) for priority, cfg in config.bands.items()}
        if 0 not in self._bands:
            self._bands[0] = Band(0, config.default_band)
        self._order = sorted(self._bands, reverse=True)  # provisioned priorities, highest first
        self._peers = PeerOccupancy(cross_replica or CrossReplicaOptions(), config, metrics)
        self._queued = 0
        self._queued_bytes = 0
        self._seq = itertools.count()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._in_flight: dict[int, InFlight] = {}
        self._closed = False
        self._wakeup = asyncio.Event()
        self._next_sweep: float | None = None
        self._next_expiry = math.inf  # earliest queue-wait deadline known at the last sweep
        self._reclaimer: Reclaimer | None = None
        if config.eviction is not None:
            self._reclaimer = Reclaimer(metrics, confirmation_grace(detector), *config.eviction)

    @classmethod
    def from_config(
        cls,
        spec: FlowControlSpec | None,
        *,
        plugins: Mapping[str, Any],
        detector: SaturationDetector,
        registry: CollectorRegistry,
        clock: Callable[[], float],
        pool_name: str,
        cross_replica: CrossReplicaOptions | None = None,
        model_labels: ModelLabelPolicy | None = None,
    ) -> FlowController:
        return cls(
            resolve_config(spec, plugins),
            detector=detector,
            metrics=FlowControlMetrics(registry, pool_name, model_labels),
            clock=clock,
            cross_replica=cross_replica,
        )

    # ---- request side -------------------------------------------------------------------------

    async def admit(
        self, request: InferenceRequest, candidates: Callable[[], Sequence[Endpoint]]
    ) -> None:
        now = self._clock()
        if self._closed:
            self._metrics.count(REJECTED_OTHER, request.priority)
            raise outcome_error(REJECTED_OTHER, has_endpoints=True)
        priority = self._priority_for(request, now)
        band = self._band(priority, now)
        item = QueuedRequest(
            request=request,
            candidates=candidates,
            fairness_id=request.fairness_id or DEFAULT_FAIRNESS_ID,
            priority=priority,
            enqueue_time=now,
            ttl=self._config.default_ttl,
            size_bytes=request.size_bytes,
            seq=next(self._seq),
            regime_since=now,
        )
        started = time.perf_counter()
        item.regime_empty = not candidates()
        labels = self._metrics.queue_labels(item)
        if not self._peers.has_capacity(band, self._queued, self._queued_bytes, item.size_bytes):
            outcome = REJECTED_NO_ENDPOINTS if item.regime_empty else REJECTED_CAPACITY
            item.outcome = outcome
            self._metrics.observe_enqueue(item, outcome, time.perf_counter() - started)
            self._metrics.finished(item, now, labels)  # no waiter yet: never queued
            raise outcome_error(outcome, has_endpoints=not item.regime_empty)
        band.push(item)
        self._next_expiry = min(self._next_expiry, self._deadline(item))
        self._queued += 1
        self._queued_bytes += item.size_bytes
        self._metrics.enter_queue(item, labels)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[item.seq] = waiter
        self._metrics.observe_enqueue(item, NOT_YET_FINALIZED, time.perf_counter() - started)
        self._wakeup.set()
        self.step()
        try:
            await waiter
        except asyncio.CancelledError:
            self._on_cancelled(item)
            raise
        if item.outcome != DISPATCHED:
            raise outcome_error(item.outcome, has_endpoints=bool(item.candidates()))

    def done(self, request: InferenceRequest, *, output_tokens: int = 0) -> None:
        """The dispatched ``request`` (the same object given to ``admit``) finished, for any
        reason. Call it once per dispatched request; other calls do nothing."""
        record = self._in_flight.pop(id(request), None)
        if record is None:
            return
        now = self._clock()
        tokens = prompt_tokens(request)
        _guard(record.fairness.on_complete, record.fairness_id, tokens, output_tokens, now)
        for adjuster in self._config.adjusters:
            _guard(adjuster.on_done, request, now)
        if self._reserving is not None:
            _guard(self._reserving.release, request)
        if self._reclaimer is not None and record.eviction is not None:
            self._reclaimer.confirm(record, now)
        self._wakeup.set()

    # ---- SharedState: queue occupancy across replicas (epp.flowcontrol.shared) ----------------

    def export_facts(self) -> list[Any]:
        self._peers.record(self._bands, self._clock())
        return self._peers.export(self._bands, self._clock())

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        self._peers.apply(facts, origin, self._clock())
        self._peers.record(self._bands, self._clock())

    async def shutdown(self) -> None:
        self._closed = True
        now = self._clock()
        for band in list(self._bands.values()):
            for flow in list(band.flows.values()):
                for item in list(flow.items()):
                    self._evict(band, item, EVICTED_OTHER, now)
        self._wakeup.set()

    # ---- dispatch loop ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            if self._queued == 0 or self._closed:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await asyncio.sleep(DISPATCH_TICK)
            self.step()

    def step(self) -> bool:
        """One dispatch cycle (plus the expiry sweep when due). True if a request left."""
        started = time.perf_counter()
        now = self._clock()
        if self._next_sweep is None or now >= min(self._next_sweep, self._next_expiry):
            self._next_sweep = now + SWEEP_INTERVAL
            try:
                self._sweep(now)
            except Exception:
                log.exception("flow control: expiry sweep failed")
        dispatched = False
        if self._queued:
            try:
                dispatched = self._dispatch_once(now)
            except Exception:
                log.exception("flow control: dispatch cycle failed")
        self._metrics.record_capacity(self._bands, self._config, self._queued, self._queued_bytes)
        self._metrics.observe_cycle(time.perf_counter() - started)
        return dispatched

    def _dispatch_once(self, now: float) -> bool:
        ceilings: list[float] | None = None
        for index, priority in enumerate(self._order):
            band = self._bands[priority]
            if not band.live:
                continue
            policy = band.config.fairness
            try:
                flow = policy.select_flow(band, now)
            except Exception:
                log.exception(
                    "flow control: %s failed; skipping band %d", policy.typed_name, priority
                )
                continue
            item = flow.peek() if flow is not None else None
            if flow is None or item is None:
                continue
            if self._peers.holds(priority, now):
                return False  # a peer has requests waiting in a higher band
            saturation = self._reader.read(item.candidates(), now)
            if ceilings is None:
                ceilings = band_ceilings(self._config.usage_limit, saturation, self._order)
            if saturation >= ceilings[index]:
                if self._reclaimer is not None:
                    in_flight = self._in_flight.values()
                    self._reclaimer.revoke(now, saturation, ceilings[index], priority, in_flight)
                return False
            band.pop(band.flows[flow.flow_id], now)
            self._left_queue(item)
            _guard(policy.on_dispatch, band, flow, item, now)
            item.outcome = DISPATCHED
            self._on_dispatched(item, policy, now)
            self._finished(item, now)
            return True
        return False

    def _on_dispatched(self, item: QueuedRequest, policy: FairnessPolicy, now: float) -> None:
        request = item.request
        evictable = self._reclaimer.filter if self._reclaimer is not None else None
        self._in_flight[id(request)] = InFlight.dispatched(item, policy, now, evictable=evictable)
        for adjuster in self._config.adjusters:
            _guard(adjuster.on_dispatch, request, now)
        if self._reserving is not None:
            _guard(self._reserving.reserve, request)

    # ---- bands, capacity, expiry --------------------------------------------------------------

    def _priority_for(self, request: InferenceRequest, now: float) -> int:
        priority = request.priority
        for adjuster in self._config.adjusters:
            try:
                priority = max(priority, adjuster.adjusted_priority(request, now))
            except Exception:
                log.exception("flow control: priority adjuster %s failed", adjuster.typed_name)
        return priority

    def _band(self, priority: int, now: float) -> Band:
        band = self._bands.get(priority)
        if band is None:
            band = Band(priority, self._config.template(priority), dynamic=True, idle_since=now)
            self._bands[priority] = band
            self._order = sorted(self._bands, reverse=True)
        return band

    def _sweep(self, now: float) -> None:
        self._next_expiry = math.inf
        for band in list(self._bands.values()):
            for flow in list(band.flows.values()):
                for item in list(flow.items()):
                    empty = not item.candidates()
                    if empty != item.regime_empty:
                        item.regime_empty, item.regime_since = empty, now
                    deadline = self._deadline(item)
                    if now >= deadline:
                        outcome = EVICTED_NO_ENDPOINTS if empty else EVICTED_TTL
                        self._evict(band, item, outcome, now)
                    else:
                        self._next_expiry = min(self._next_expiry, deadline)
            if band.dynamic and not band.live and now - band.idle_since >= BAND_GC_TIMEOUT:
                del self._bands[band.priority]
                self._order = sorted(self._bands, reverse=True)
                self._metrics.forget_band(band.priority)

    def _deadline(self, item: QueuedRequest) -> float:
        """When the item's queue-wait budget in its current regime runs out (inf: never)."""
        budget = self._config.no_endpoint_ttl if item.regime_empty else item.ttl
        if budget <= 0:
            return math.inf
        return max(item.enqueue_time, item.regime_since) + budget

    def _evict(self, band: Band, item: QueuedRequest, outcome: str, now: float) -> None:
        item.outcome = outcome
        band.discard(item, now)
        self._left_queue(item)
        self._finished(item, now)

    def _on_cancelled(self, item: QueuedRequest) -> None:
        now = self._clock()
        if not item.outcome:
            self._evict(self._bands[item.priority], item, EVICTED_CONTEXT_CANCELLED, now)
        elif item.outcome == DISPATCHED:
            # Dispatched in the same instant the client left: nobody will call done().
            self.done(item.request)

    def _left_queue(self, item: QueuedRequest) -> None:
        self._queued -= 1
        self._queued_bytes -= item.size_bytes
        self._metrics.leave_queue(item)

    def _finished(self, item: QueuedRequest, now: float) -> None:
        waiter = self._waiters.pop(item.seq, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self._metrics.finished(item, now)

    # ---- introspection (tests, admin view) ----------------------------------------------------

    def queued(self, priority: int | None = None) -> int:
        if priority is None:
            return self._queued
        band = self._bands.get(priority)
        return band.live if band else 0

    def in_flight(self) -> int:
        return len(self._in_flight)

    def priorities(self) -> list[int]:
        return list(self._order)


def _guard(fn: Callable[..., Any], *args: Any) -> None:
    """Run a plugin hook; a failing hook is logged, never allowed to break the dispatch loop."""
    try:
        fn(*args)
    except Exception:
        log.exception("flow control: hook %s failed", getattr(fn, "__qualname__", fn))
