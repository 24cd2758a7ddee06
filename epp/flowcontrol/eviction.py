"""In-flight eviction (``flowControl.enableEviction``): reclaim capacity from sheddable requests.

When a priority band with queued requests is gated (``saturation >= ceiling``), the controller
may revoke requests already dispatched to the model servers. Victims are the requests the
eviction filter policy accepted at dispatch (``sheddable-eviction-filter`` by default: priority
< 0) that are strictly below the gated band's priority, taken in the eviction ordering policy's
order (``priority-then-time-eviction-order-policy`` by default: lowest priority first, then most
recently dispatched first). Sizing and pacing, in saturation units::

    reclaim_target = saturation - ceiling
    credit         = saturation / requests_in_flight        # mean footprint of one request
    n              = max(1, ceil((reclaim_target - pending) / credit)),
                     at most maxRevocationsPerDecision (2) and the number of victims

A new decision waits until every earlier revocation is confirmed (the evicted request's stream
ended, i.e. ``FlowController.done``) and a grace period passed, so the saturation signal has
absorbed the freed capacity; an unconfirmed revocation counts as confirmed after 10 s.

An evicted request learns it through the ``Eviction`` object the controller put in its
``attributes[EVICTION_ATTRIBUTE]`` at dispatch (only when the filter accepted it): the ext_proc
stream answers it with a 429 ImmediateResponse carrying ``x-llm-d-request-dropped-reason:
evicted``, even mid-response.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from epp.flowcontrol.metrics import FlowControlMetrics
from epp.plugin import DropReason, ErrorCode, InferenceError, InferenceRequest
from epp.plugin.flow import (
    EvictionFilterPolicy,
    EvictionItem,
    EvictionOrderingPolicy,
    FairnessPolicy,
    QueuedRequest,
)

log = logging.getLogger(__name__)

EVICTION_ATTRIBUTE: Final = "flow-control/eviction"
MAX_REVOCATIONS_PER_DECISION: Final = 2
CONFIRMATION_TIMEOUT: Final = 10.0
EVICTED_MESSAGE: Final = "request evicted by flow control"


class Eviction:
    """The eviction signal of one dispatched sheddable request."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.error: InferenceError | None = None

    @property
    def evicted(self) -> bool:
        return self.error is not None

    def fire(self) -> None:
        if self.error is None:
            self.error = InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED, EVICTED_MESSAGE, drop_reason=DropReason.EVICTED
            )
            self._event.set()

    async def wait(self) -> InferenceError:
        """Returns the 429 to answer with, once the request is evicted."""
        await self._event.wait()
        assert self.error is not None
        return self.error


@dataclass(slots=True, eq=False)
class InFlight:
    """A request dispatched by flow control and not done yet."""

    request: InferenceRequest
    priority: int
    fairness_id: str
    dispatched_at: float
    seq: int
    fairness: FairnessPolicy
    eviction: Eviction | None = None

    @classmethod
    def dispatched(
        cls,
        item: QueuedRequest,
        fairness: FairnessPolicy,
        now: float,
        *,
        evictable: EvictionFilterPolicy | None,
    ) -> InFlight:
        """The record of ``item``, dispatched at ``now``. With eviction enabled (``evictable``, the
        eviction filter policy), a request it accepts gets its ``Eviction`` in
        ``attributes[EVICTION_ATTRIBUTE]``."""
        record = cls(item.request, item.priority, item.fairness_id, now, item.seq, fairness)
        if evictable is not None and _accepts(evictable, record.as_item()):
            record.eviction = Eviction()
            item.request.attributes[EVICTION_ATTRIBUTE] = record.eviction
        return record

    def as_item(self) -> EvictionItem:
        """What eviction policies see of this request."""
        return EvictionItem(
            self.request, self.priority, self.fairness_id, self.dispatched_at, self.seq
        )


def _accepts(policy: EvictionFilterPolicy, item: EvictionItem) -> bool:
    try:
        return bool(policy.evictable(item))
    except Exception:  # a policy that raises keeps the request: never evict by accident
        log.exception("eviction filter policy %s failed", policy.typed_name)
        return False


@dataclass
class Reclaimer:
    """Decides how many in-flight requests to revoke, and paces the decisions."""

    metrics: FlowControlMetrics
    grace: float
    filter: EvictionFilterPolicy
    ordering: EvictionOrderingPolicy
    timeout: float = CONFIRMATION_TIMEOUT
    max_revocations: int = MAX_REVOCATIONS_PER_DECISION
    outstanding: dict[int, tuple[float, float]] = field(default_factory=dict)  # credit, issued
    cooling: list[tuple[float, float]] = field(default_factory=list)  # credit, expires
    pending: float = 0.0

    def gate_open(self, now: float) -> bool:
        for key, (credit, issued) in list(self.outstanding.items()):
            if now - issued >= self.timeout:
                del self.outstanding[key]
                self.cooling.append((credit, now + self.grace))
                self.metrics.revocations.labels("timed_out", self.metrics.pool).inc()
        for credit, expires in [c for c in self.cooling if c[1] <= now]:
            self.cooling.remove((credit, expires))
            self.pending = max(0.0, self.pending - credit)
        self.metrics.pending_reclaim.labels(self.metrics.pool).set(self.pending)
        return not self.outstanding and not self.cooling

    def revoke(
        self,
        now: float,
        saturation: float,
        ceiling: float,
        demand_priority: int,
        in_flight: Iterable[InFlight],
    ) -> None:
        """One eviction decision for the gated band ``demand_priority``: once earlier revocations
        are confirmed (``gate_open``), fire the eviction signal of each chosen victim."""
        if not self.gate_open(now):
            return
        victims = self.reclaim(
            now=now,
            saturation=saturation,
            ceiling=ceiling,
            demand_priority=demand_priority,
            in_flight=in_flight,
        )
        for record in victims:
            assert record.eviction is not None
            record.eviction.fire()
            log.info(
                "flow control: evicting an in-flight request",
                extra={
                    "request_id": record.request.request_id,
                    "priority": record.priority,
                    "forPriority": demand_priority,
                },
            )

    def reclaim(
        self,
        *,
        now: float,
        saturation: float,
        ceiling: float,
        demand_priority: int,
        in_flight: Iterable[InFlight],
    ) -> list[InFlight]:
        """Choose and register the victims of one decision (``revoke`` fires them)."""
        records = list(in_flight)
        candidates = [
            r
            for r in records
            if r.eviction is not None and not r.eviction.evicted and r.priority < demand_priority
        ]
        victims = self._in_eviction_order(candidates)
        if not records or not victims or saturation <= 0:
            return []
        credit = saturation / len(records)
        target = saturation - ceiling
        self.metrics.reclaim_target.labels(self.metrics.pool).set(target)
        net = target - self.pending
        if net < 0 or (net == 0 and self.pending > 0):
            return []
        n = min(max(1, math.ceil(net / credit)), self.max_revocations, len(victims))
        chosen = victims[:n]
        for record in chosen:
            self.outstanding[id(record.request)] = (credit, now)
            self.pending += credit
        self.metrics.revocations_issued.labels(str(demand_priority), self.metrics.pool).inc(
            len(chosen)
        )
        self.metrics.pending_reclaim.labels(self.metrics.pool).set(self.pending)
        return chosen

    def _in_eviction_order(self, candidates: list[InFlight]) -> list[InFlight]:
        """``candidates`` sorted by the ordering policy (none, when the policy raises)."""
        if not candidates:
            return []
        try:
            keys = [tuple(self.ordering.eviction_key(r.as_item())) for r in candidates]
        except Exception:
            log.exception("eviction ordering policy %s failed", self.ordering.typed_name)
            return []
        order = sorted(range(len(candidates)), key=keys.__getitem__)
        return [candidates[i] for i in order]

    def confirm(self, record: InFlight, now: float) -> None:
        """The evicted request's stream ended: its capacity is being freed."""
        entry = self.outstanding.pop(id(record.request), None)
        if entry is None:
            return
        credit, issued = entry
        self.cooling.append((credit, now + self.grace))
        self.metrics.revocations.labels("confirmed", self.metrics.pool).inc()
        self.metrics.confirmation.labels(self.metrics.pool).observe(max(0.0, now - issued))
