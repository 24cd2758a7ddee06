"""Other EPP replicas' in-flight load, for ``inflight-load-producer`` (see its docstring).

A fact is one replica's absolute in-flight counts on some endpoints::

    {"src": <random id of the publishing process>, "v": [<run epoch ms>, <n>], "full": <bool>,
     "loads": {<endpoint id>: [<requests>, <tokens>], ...}}

``v`` orders one replica's facts, across its restarts too (a later run has a later epoch). A
``full`` fact lists every endpoint where the replica has something in flight: endpoints it does
not list are idle there, and every fact older than it is superseded. Others list the endpoints
that changed (zeros included).

The receiver keeps, per origin, the newest count of each endpoint with the version that set it,
so a duplicate or an older, reordered fact changes nothing; a lost one is healed by the next
change of that endpoint or the next full refresh. An origin that sends nothing newer for
``ttl`` is dropped with all its counts. Per endpoint, the sum over origins is kept, with a short
history of when (in this replica's clock) that sum changed, so a scrape can be matched with the
peer load known at its time.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterable, KeysView, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

MAX_FACT_ENDPOINTS: Final = 1024
"""Endpoints one fact lists at most (a larger refresh goes out in several partial facts)."""
MAX_DIRTY: Final = 4096
"""Changed endpoints remembered between exports; more turn the next export into a full one."""
MAX_ORIGINS: Final = 256
MAX_ORIGIN_ENDPOINTS: Final = 8192
MAX_HISTORY: Final = 64
"""Changes of an endpoint's peer total remembered (oldest dropped first)."""

Version = tuple[int, int]


class LoadPublisher:
    """What this replica tells the others: absolute counts of changed endpoints, and every
    ``refresh`` seconds (and on the first export) a full refresh."""

    def __init__(self, refresh: float) -> None:
        self.token = secrets.token_hex(8)
        self._epoch = int(time.time() * 1000)  # orders this run after the replica's earlier ones
        self._n = 0
        self._refresh = refresh
        self._dirty: set[str] = set()
        self._full_due = True
        self._last_full = -math.inf

    def touch(self, endpoint_id: str) -> None:
        """``endpoint_id``'s count changed here."""
        if len(self._dirty) < MAX_DIRTY:
            self._dirty.add(endpoint_id)
        else:
            self._full_due = True

    def export(
        self,
        now: float,
        load: Callable[[str], tuple[int, int]],
        busy: Callable[[], Iterable[str]],
    ) -> list[Any]:
        """``load(id)``: this replica's (requests, tokens) there; ``busy()``: the endpoints where
        they are not both zero."""
        full = self._full_due or now - self._last_full >= self._refresh
        ids = list(busy()) if full else list(self._dirty)
        self._dirty.clear()
        if full:
            self._full_due = False
            self._last_full = now
        elif not ids:
            return []
        if len(ids) > MAX_FACT_ENDPOINTS:
            full = False  # too big for one fact: sent as partial updates
        facts = []
        for start in range(0, max(1, len(ids)), MAX_FACT_ENDPOINTS):
            chunk = ids[start : start + MAX_FACT_ENDPOINTS]
            self._n += 1
            facts.append(
                {
                    "src": self.token,
                    "v": [self._epoch, self._n],
                    "full": full,
                    "loads": {eid: list(load(eid)) for eid in chunk},
                }
            )
        return facts


@dataclass
class _Origin:
    src: str
    heard: float  # when its newest fact arrived (this replica's clock)
    version: Version = (0, 0)  # newest fact applied
    full_version: Version = (0, 0)  # newest full refresh: anything older is superseded
    loads: dict[str, tuple[int, int, Version]] = field(default_factory=dict)


class PeerLoads:
    """The other replicas' counts, summed per endpoint (see the module docstring)."""

    def __init__(self, ttl: float, window: float) -> None:
        self._ttl = ttl
        self._window = window  # how far back a scrape time may be matched
        self._origins: dict[str, _Origin] = {}
        self.totals: dict[str, tuple[int, int]] = {}
        # endpoint id -> (when known, peer requests from then on), oldest first
        self._history: dict[str, deque[tuple[float, int]]] = {}
        self._check_at = math.inf  # when the longest-silent origin expires
        self._swept_at = -math.inf
        self.generation = 0
        """Counts every change of ``totals`` or of the history ``requests_since`` reads."""

    @property
    def origins(self) -> Mapping[str, _Origin]:
        return self._origins

    def apply(self, facts: Sequence[Any], origin: str, now: float, own: str) -> None:
        """Merge ``origin``'s facts (facts this process published, ``src == own``, are not)."""
        changed: set[str] = set()
        for fact in facts:
            parsed = _parse(fact)
            if parsed is not None and parsed[0] != own:
                self._apply_one(origin, parsed, now, changed)
        self._retotal(changed, now)
        self._check_at = min((o.heard for o in self._origins.values()), default=math.inf)
        self._check_at += self._ttl
        self.expire(now)
        if now >= self._swept_at:
            self._swept_at = now + self._window
            self._sweep_history(now - self._window)

    def expire(self, now: float) -> None:
        """Drop origins that sent nothing newer for longer than the TTL."""
        if now <= self._check_at:
            return
        changed: set[str] = set()
        for name, o in list(self._origins.items()):
            if now - o.heard > self._ttl:
                changed.update(o.loads)
                del self._origins[name]
        self._retotal(changed, now)
        self._check_at = min((o.heard for o in self._origins.values()), default=math.inf)
        self._check_at += self._ttl

    def _sweep_history(self, horizon: float) -> None:
        for eid in list(self._history):
            history = self._history[eid]
            _prune(history, horizon)
            if len(history) == 1 and eid not in self.totals and history[0][1] == 0:
                del self._history[eid]
        self.generation += 1

    def requests_since(self, endpoint_id: str, since: float) -> int:
        """Peer requests there now minus those known at ``since`` (this replica's clock)."""
        history = self._history.get(endpoint_id)
        if not history:
            return 0
        now_total = history[-1][1]
        for when, total in reversed(history):
            if when <= since:
                return now_total - total
        return now_total - history[0][1]

    def has_history(self, endpoint_id: str) -> bool:
        return endpoint_id in self._history

    def history_ids(self) -> KeysView[str]:
        """The endpoints ``has_history`` is true for (a live view)."""
        return self._history.keys()

    def _apply_one(self, origin: str, parsed: _Fact, now: float, changed: set[str]) -> None:
        src, version, full, loads = parsed
        o = self._origins.get(origin)
        if o is None:
            if len(self._origins) >= MAX_ORIGINS:
                return
            o = self._origins[origin] = _Origin(src, now)
        if version <= o.full_version:
            return  # a full refresh since has superseded it (or a duplicate)
        if version > o.version:
            o.src, o.version, o.heard = src, version, now
        if full:
            o.full_version = version
            for eid, (_, _, set_by) in list(o.loads.items()):
                if set_by < version and eid not in loads:
                    del o.loads[eid]
                    changed.add(eid)
        for eid, (requests, tokens) in loads.items():
            held = o.loads.get(eid)
            if held is not None and held[2] >= version:
                continue
            if held is None and len(o.loads) >= MAX_ORIGIN_ENDPOINTS:
                continue
            o.loads[eid] = (requests, tokens, version)
            changed.add(eid)

    def _retotal(self, endpoint_ids: Iterable[str], now: float) -> None:
        origins = self._origins.values()
        for eid in endpoint_ids:
            requests = tokens = 0
            for o in origins:
                held = o.loads.get(eid)
                if held is not None:
                    requests += held[0]
                    tokens += held[1]
            self.generation += 1
            before = self.totals.get(eid, (0, 0))[0]
            if requests or tokens:
                self.totals[eid] = (requests, tokens)
            else:
                self.totals.pop(eid, None)
            if requests != before:
                history = self._history.get(eid)
                if history is None:
                    history = self._history[eid] = deque([(-math.inf, before)], MAX_HISTORY)
                history.append((now, requests))


def _prune(history: deque[tuple[float, int]], horizon: float) -> None:
    """Drop changes before ``horizon``, keeping the last of them (the value at the horizon)."""
    while len(history) > 1 and history[1][0] <= horizon:
        history.popleft()


_Fact = tuple[str, Version, bool, dict[str, tuple[int, int]]]


def _parse(fact: Any) -> _Fact | None:
    """A well-formed fact, or None (a malformed one is ignored as a whole)."""
    if not isinstance(fact, dict):
        return None
    src, v, full, loads = fact.get("src"), fact.get("v"), fact.get("full"), fact.get("loads")
    if not isinstance(src, str) or not isinstance(full, bool) or not isinstance(loads, dict):
        return None
    if not (isinstance(v, list) and len(v) == 2 and all(_count(x) for x in v)):
        return None
    if len(loads) > MAX_FACT_ENDPOINTS:
        return None
    parsed: dict[str, tuple[int, int]] = {}
    for eid, pair in loads.items():
        if not (isinstance(pair, list) and len(pair) == 2 and _count(pair[0]) and _count(pair[1])):
            return None
        parsed[eid] = (pair[0], pair[1])
    return src, (v[0], v[1]), full, parsed


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
