"""The ``session_id`` bindings of ``session-affinity-scorer``: session id → endpoint id, each with
its last use, bounded, and shared with other EPP replicas (see that module's docstring).

Order and eviction are by last use, whoever learned the binding: a heap of (last use, seq,
session) holds every write, live while its seq is the binding's; its front is the least recently
used binding. Facts are ``{"session": <id>, "endpoint": <endpoint id>, "age": <seconds since
last use, at export>}``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final, NamedTuple

MAX_BINDINGS: Final = 100_000
MAX_EXPORT: Final = 4096
"""Bindings one export hands over at most (the oldest are dropped first)."""
MAX_ID_LENGTH: Final = 1024
"""Longest session or endpoint id accepted from a peer."""
REFRESH_SHARE_FRACTION: Final = 8
"""A binding reused on the same endpoint is re-exported at most once every ``ttl / 8``."""
_COMPACT_SLACK: Final = 1024  # stale heap entries tolerated beyond the live count


class _Binding(NamedTuple):
    endpoint: str
    seen: float  # last use (this replica's clock)
    seq: int  # of the write that set it: its heap entry is live while they match
    shared: float  # last use a peer was told about (no re-export of a refresh before long)


class SessionBindings:
    """Session id → endpoint id, least recently used evicted first (see the module docstring)."""

    def __init__(self, ttl: float, capacity: int = MAX_BINDINGS) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self.refresh_share = ttl / REFRESH_SHARE_FRACTION
        self._entries: dict[str, _Binding] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        # bindings to hand to other replicas; None until the sync engine first asks (``export``):
        # without a cross-replica syncer nothing is queued
        self._pending: OrderedDict[str, tuple[str, float]] | None = None
        self.export_dropped = 0

    def __len__(self) -> int:
        return len(self._entries)

    def bound(self, ttl: float, capacity: int) -> None:
        """Change the TTL and the capacity (the least recently used beyond it evicted now)."""
        self.ttl = ttl
        self.capacity = capacity
        self.refresh_share = ttl / REFRESH_SHARE_FRACTION
        self._trim()

    @property
    def pending(self) -> int:
        return len(self._pending) if self._pending is not None else 0

    def get(self, session: str, now: float) -> str:
        entry = self._entries.get(session)
        if entry is None or now - entry.seen > self.ttl:
            return ""
        return entry.endpoint

    def commit(self, session: str, endpoint_id: str, now: float, *, absent: bool) -> bool:
        """Bind (or refresh) after scheduling. A live binding to another endpoint moves only
        when this request saw its endpoint absent from the candidates (``absent``). Returns
        whether the binding is new or moved (peers should hear of it at once)."""
        entry = self._entries.get(session)
        live = entry is not None and now - entry.seen <= self.ttl
        if entry is not None and live and entry.endpoint != endpoint_id and not absent:
            return False
        shared = entry.shared if entry is not None and live else -math.inf
        fresh = entry is None or not live or entry.endpoint != endpoint_id
        if fresh:
            shared = -math.inf  # new or moved: peers must hear of it now
        if now - shared >= self.refresh_share:
            self._queue(session, endpoint_id, now)
            shared = now
        self._write(session, endpoint_id, now, shared)
        self._trim()
        return fresh

    def sweep(self, now: float) -> None:
        heap = self._heap
        while heap and now - heap[0][0] > self.ttl:
            self._pop_live()

    # ---- sharing --------------------------------------------------------------------------

    def export(self, now: float) -> list[Any]:
        """The bindings made or moved here since the last call, and refreshes due; the first
        call starts the queueing."""
        if self._pending is None:
            self._pending = OrderedDict()
        facts = [
            {"session": session, "endpoint": eid, "age": max(0.0, now - seen)}
            for session, (eid, seen) in self._pending.items()
        ]
        self._pending.clear()
        return facts

    def apply(self, facts: Sequence[Any], now: float) -> int:
        """Merge a peer's bindings; returns how many changed a binding here."""
        self.sweep(now)
        applied = sum(1 for fact in facts if self._apply_one(fact, now))
        if applied:
            self._trim()
        return applied

    def _apply_one(self, fact: Any, now: float) -> bool:
        if not isinstance(fact, dict):
            return False
        session, eid, age = fact.get("session"), fact.get("endpoint"), fact.get("age")
        if not (_is_id(session) and _is_id(eid)) or not _is_age(age) or age > self.ttl:
            return False
        seen = now - age
        held = self._entries.get(session)
        if held is not None and (held.seen, held.endpoint) >= (seen, eid):
            if held.endpoint != eid:
                # A peer routes this session elsewhere on older news: tell it ours.
                self._queue(session, held.endpoint, held.seen)
            return False
        self._write(session, eid, seen, seen)
        return True

    # ---- storage --------------------------------------------------------------------------

    def _queue(self, session: str, endpoint_id: str, seen: float) -> None:
        pending = self._pending
        if pending is None:
            return
        pending[session] = (endpoint_id, seen)
        pending.move_to_end(session)
        if len(pending) > MAX_EXPORT:
            pending.popitem(last=False)
            self.export_dropped += 1

    def _write(self, session: str, endpoint_id: str, seen: float, shared: float) -> None:
        seq = next(self._seq)
        self._entries[session] = _Binding(endpoint_id, seen, seq, shared)
        heapq.heappush(self._heap, (seen, seq, session))
        if len(self._heap) > 2 * len(self._entries) + _COMPACT_SLACK:
            self._heap = sorted((b.seen, b.seq, s) for s, b in self._entries.items())

    def _pop_live(self) -> bool:
        """Pop the heap's front; True if it was a live binding (then deleted)."""
        _, seq, session = heapq.heappop(self._heap)
        entry = self._entries.get(session)
        if entry is None or entry.seq != seq:
            return False
        del self._entries[session]
        return True

    def _trim(self) -> None:
        while len(self._entries) > self.capacity:
            self._pop_live()


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH


def _is_age(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
