"""Flow queues and priority bands: the storage the dispatch loop works on.

A ``FlowQueue`` is a heap ordered by the band's ordering policy. Requests that leave the queue
other than by dispatch (client gone, TTL) are marked finalized and discounted at once, so their
capacity is free immediately; their heap entries are dropped lazily when they reach the head, or
all together when dead entries outnumber live ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from epp.plugin.flow import FairnessPolicy, OrderingPolicy, QueuedRequest

_COMPACT_SLACK = 64  # dead heap entries tolerated beyond the live count before a rebuild


class FlowQueue:
    """The requests of one flow ``(fairness_id, priority)``, best first."""

    __slots__ = ("_dead", "_heap", "_ordering", "bytes", "flow_id", "live")

    def __init__(self, flow_id: str, ordering: OrderingPolicy) -> None:
        self.flow_id = flow_id
        self._ordering = ordering
        self._heap: list[tuple[tuple[Any, ...], int, QueuedRequest]] = []
        self._dead = 0
        self.live = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.live

    def push(self, item: QueuedRequest) -> None:
        heapq.heappush(self._heap, (tuple(self._ordering.order_key(item)), item.seq, item))
        self.live += 1
        self.bytes += item.size_bytes

    def peek(self) -> QueuedRequest | None:
        self._prune()
        return self._heap[0][2] if self._heap else None

    def head_key(self) -> tuple[Any, ...]:
        self._prune()
        key, seq, _ = self._heap[0]
        return (*key, seq)

    def pop(self) -> QueuedRequest:
        """Remove and return the head (the caller checked it exists)."""
        self._prune()
        _, _, item = heapq.heappop(self._heap)
        self.live -= 1
        self.bytes -= item.size_bytes
        return item

    def discard(self, item: QueuedRequest) -> None:
        """Account for ``item`` (already finalized) leaving the queue from anywhere in it."""
        self.live -= 1
        self.bytes -= item.size_bytes
        self._dead += 1
        if self._dead > self.live + _COMPACT_SLACK:
            self._heap = [entry for entry in self._heap if not entry[2].outcome]
            heapq.heapify(self._heap)
            self._dead = 0

    def items(self) -> Iterator[QueuedRequest]:
        """The live requests, in no particular order."""
        return (entry[2] for entry in self._heap if not entry[2].outcome)

    def _prune(self) -> None:
        heap = self._heap
        while heap and heap[0][2].outcome:
            heapq.heappop(heap)
            self._dead -= 1


@dataclass
class BandConfig:
    """Resolved configuration of one priority band (or of a template for new bands)."""

    max_requests: int
    max_bytes: int
    fairness: FairnessPolicy
    ordering: OrderingPolicy


@dataclass(eq=False)
class Band:
    """All flows of one priority. ``dynamic`` bands were created on demand and may be collected."""

    priority: int
    config: BandConfig
    dynamic: bool = False
    flows: dict[str, FlowQueue] = field(default_factory=dict)
    live: int = 0
    bytes: int = 0
    idle_since: float = 0.0
    state: Any = None

    def __post_init__(self) -> None:
        self.state = self.config.fairness.new_state()

    def active_flows(self) -> Iterator[FlowQueue]:
        return iter(self.flows.values())

    def push(self, item: QueuedRequest) -> None:
        flow = self.flows.get(item.fairness_id)
        if flow is None:
            flow = self.flows[item.fairness_id] = FlowQueue(item.fairness_id, self.config.ordering)
        flow.push(item)
        self.live += 1
        self.bytes += item.size_bytes

    def pop(self, flow: FlowQueue, now: float) -> QueuedRequest:
        item = flow.pop()
        self._left(flow, item, now)
        return item

    def discard(self, item: QueuedRequest, now: float) -> None:
        flow = self.flows.get(item.fairness_id)
        if flow is None:
            return
        flow.discard(item)
        self._left(flow, item, now)

    def _left(self, flow: FlowQueue, item: QueuedRequest, now: float) -> None:
        self.live -= 1
        self.bytes -= item.size_bytes
        if not flow.live:
            # Empty flows go at once: memory stays bounded by what is queued, and round-robin
            # cursors work on flow ids, not on queue objects.
            del self.flows[flow.flow_id]
        if not self.live:
            self.idle_since = now
