"""In-flight eviction (``flowControl.enableEviction``): reclaim capacity from sheddable requests.

When a priority band with queued requests is gated (``saturation >= ceiling``), the controller
may revoke requests already dispatched to the model servers. Victims are sheddable
(priority < 0) and strictly below the gated band's priority, taken lowest priority first, then
most recently dispatched first. Sizing and pacing, in saturation units::

    reclaim_target = saturation - ceiling
    credit         = saturation / requests_in_flight        # mean footprint of one request
    n              = max(1, ceil((reclaim_target - pending) / credit)),
                     at most maxRevocationsPerDecision (2) and the number of victims

A new decision waits until every earlier revocation is confirmed (the evicted request's stream
ended, i.e. ``FlowController.done``) and a grace period passed, so the saturation signal has
absorbed the freed capacity; an unconfirmed revocation counts as confirmed after 10 s.

An evicted request learns it through the ``Eviction`` object the controller put in its
``attributes[EVICTION_ATTRIBUTE]`` at dispatch: the ext_proc stream answers it with a 429
ImmediateResponse carrying ``x-llm-d-request-dropped-reason: evicted``, even mid-response.
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
from epp.plugin.flow import FairnessPolicy, QueuedRequest

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
        cls, item: QueuedRequest, fairness: FairnessPolicy, now: float, *, evictable: bool
    ) -> InFlight:
        """The record of ``item``, dispatched at ``now``. With eviction enabled (``evictable``), a
        sheddable request gets its ``Eviction`` in ``attributes[EVICTION_ATTRIBUTE]``."""
        request, eviction = item.request, None
        if evictable and item.priority < 0:
            eviction = Eviction()
            request.attributes[EVICTION_ATTRIBUTE] = eviction
        return cls(request, item.priority, item.fairness_id, now, item.seq, fairness, eviction)


@dataclass
class Reclaimer:
    """Decides how many in-flight requests to revoke, and paces the decisions."""

    metrics: FlowControlMetrics
    grace: float
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
        victims = sorted(
            (
                r
                for r in records
                if r.eviction is not None
                and not r.eviction.evicted
                and r.priority < 0
                and r.priority < demand_priority
            ),
            key=lambda r: (r.priority, -r.seq),
        )
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

    def confirm(self, record: InFlight, now: float) -> None:
        """The evicted request's stream ended: its capacity is being freed."""
        entry = self.outstanding.pop(id(record.request), None)
        if entry is None:
            return
        credit, issued = entry
        self.cooling.append((credit, now + self.grace))
        self.metrics.revocations.labels("confirmed", self.metrics.pool).inc()
        self.metrics.confirmation.labels(self.metrics.pool).observe(max(0.0, now - issued))
