"""An endpoint's KV-cache use as of now: its last scrape corrected by what this EPP's own
requests changed there since, and the KV its own requests in flight there will hold.

A plugin that wants it owns a ``KVTracker`` and feeds it from its PreRequest (``dispatch``: the
endpoint, the time, the tokens the request will hold) and ResponseComplete (``complete``: the
tokens it held, as the server reported them, else those given at dispatch) hooks, with the
handle's monotonic clock, the clock ``Metrics.update_time`` is read on. Then:

* ``tracker.change(endpoint, t)``: what this EPP's requests dispatched after ``t`` and still in
  flight added, minus what its requests dispatched at or before ``t`` and completed after ``t``
  held (tokens);
* ``tracker.in_flight(endpoint)``: the tokens of its requests in flight there;
* ``usage_now(endpoint, now, tracker)``: the scraped ``kv_cache_usage_percent`` plus
  ``change / capacity`` (capacity = ``cache_num_blocks * cache_block_size``), when the endpoint
  reports its capacity and the scrape is at most ``STALENESS_SECONDS`` old; else the scraped value;
  1.0 without metrics. Clamped to [0, 1];
* ``demand_now(endpoint, now, tracker)``: the larger of ``usage_now`` and ``in_flight / capacity``
  (unclamped above 1): a request this EPP sent that still waits in the server's queue holds no KV
  yet and is missing from the scrape, but it will hold its KV once it runs;
* ``request_kv_tokens(request)``: what a request will hold at most, its prompt and its output
  limit (what a tracker fed for headroom records at dispatch).

Memory is bounded: at most ``MAX_OPEN`` requests in flight (the oldest forgotten first) and, per
endpoint, at most ``MAX_DONE`` completion records, each dropped once a scrape after it has been
used (that scrape saw the completion) or once older than ``horizon`` seconds (a scrape that old
is not corrected). Cost: ``change`` is kept per endpoint for its scrape time and updated by every
dispatch and completion there, so it walks the records only once per scrape (not once per request
and endpoint: at a high rate a scrape interval holds many completions); ``usages`` and ``rooms``
keep each endpoint's value until its metrics, its records or its scrape's freshness change.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

from epp.plugin.flow import prompt_tokens
from epp.plugin.types import Endpoint, InferenceRequest

MAX_OPEN: Final = 65536
MAX_DONE: Final = 4096
STALENESS_SECONDS: Final = 2.0
"""A scrape older than this is not corrected (the EPP's ``--metrics-staleness-threshold``)."""


class _Open(NamedTuple):
    endpoint: str
    sent: float
    tokens: int


class KVTracker:
    def __init__(self, horizon: float = STALENESS_SECONDS) -> None:
        self.horizon = horizon
        self._open: dict[str, _Open] = {}  # request id → record, in dispatch order
        # endpoint id → {request id: (dispatch time, tokens)}, in dispatch order
        self._by_endpoint: dict[str, dict[str, tuple[float, int]]] = {}
        self._in_flight: dict[str, int] = {}  # endpoint id → tokens of its open requests
        # endpoint id → (completion time, dispatch time, tokens), in completion order
        self._done: dict[str, deque[tuple[float, float, int]]] = {}
        # endpoint id → [scrape time, change since it]: kept up to date by every dispatch and
        # completion, computed again (a walk of the records) only for a newer scrape
        self._since: dict[str, list[float]] = {}
        # endpoint id → (metrics, valid until, usage): ``usages``' last value, kept while the
        # endpoint's metrics are the same object and the time is before ``valid until``; a change
        # to its records here drops it (``_drop_memos``); ``rooms``' likewise, with its
        # ``max_usage``
        self._usage_memo: dict[str, tuple[object, float, float]] = {}
        self._room_memo: dict[str, tuple[object, float, float, float | None]] = {}
        self._usage_staleness = STALENESS_SECONDS
        self._swept_at = 0.0

    def __len__(self) -> int:
        return len(self._open)

    def dispatch(self, request_id: str, endpoint_id: str, now: float, tokens: int) -> None:
        if request_id in self._open:
            return
        if len(self._open) >= MAX_OPEN:
            self._forget(next(iter(self._open)))
        self._open[request_id] = _Open(endpoint_id, now, tokens)
        self._by_endpoint.setdefault(endpoint_id, {})[request_id] = (now, tokens)
        self._in_flight[endpoint_id] = self._in_flight.get(endpoint_id, 0) + tokens
        self._drop_memos(endpoint_id)
        since = self._since.get(endpoint_id)
        if since is not None and now > since[0]:
            since[1] += tokens

    def complete(self, request_id: str, now: float, held_tokens: int) -> None:
        """Record a completion; ``held_tokens`` 0 = the tokens recorded at dispatch."""
        entry = self._forget(request_id)
        if entry is None:
            return
        eid, held = entry.endpoint, held_tokens or entry.tokens
        done = self._done.get(eid)
        if done is None:
            done = self._done[eid] = deque(maxlen=MAX_DONE)
        since = self._since.get(eid)
        if since is not None and entry.sent <= since[0] < now:
            since[1] -= held  # the scrape counted it: what it held is free again
        if len(done) == MAX_DONE:
            self._since.pop(eid, None)  # the oldest record falls out: walk again
        done.append((now, entry.sent, held))
        if _drop_until(done, now - self.horizon):
            self._since.pop(eid, None)
        if now - self._swept_at > self.horizon:
            self._sweep(now)

    def tracks(self, endpoint_id: str) -> bool:
        """Whether ``change`` may be non-zero there (elsewhere it is 0)."""
        return endpoint_id in self._by_endpoint or endpoint_id in self._done

    def in_flight(self, endpoint_id: str) -> int:
        return self._in_flight.get(endpoint_id, 0)

    def change(self, endpoint_id: str, scraped_at: float) -> int:
        """Tokens this EPP added minus released on ``endpoint_id`` since ``scraped_at``."""
        since = self._since.get(endpoint_id)
        if since is not None and since[0] == scraped_at:
            return int(since[1])
        released = 0
        done = self._done.get(endpoint_id)
        if done is not None:
            _drop_until(done, scraped_at)  # that scrape has seen every earlier completion
            if done:
                released = sum(tokens for _, sent, tokens in done if sent <= scraped_at)
            else:
                del self._done[endpoint_id]
        added = 0
        opened = self._by_endpoint.get(endpoint_id)
        if opened:
            for sent, tokens in reversed(opened.values()):  # newest first; stop at the scrape
                if sent <= scraped_at:
                    break
                added += tokens
        self._since[endpoint_id] = [scraped_at, added - released]
        return added - released

    def usages(
        self, endpoints: Sequence[Endpoint], now: float, staleness: float = STALENESS_SECONDS
    ) -> list[float]:
        """``usage_now`` of each endpoint, in order. An endpoint's value is computed again only
        when its metrics, its records here or (through its scrape's age) the time have changed:
        with every pod busy, a request pays a lookup per pod, not a correction."""
        memo = self._usage_memo
        if staleness != self._usage_staleness:  # the memo holds values for one staleness
            memo.clear()
            self._usage_staleness = staleness
        out: list[float] = []
        for ep in endpoints:
            m = ep.metrics
            if m is None:
                out.append(1.0)
                continue
            held = memo.get(ep.id)
            if held is not None and held[0] is m and now <= held[1]:
                out.append(held[2])
                continue
            value = usage_now(ep, now, self, staleness)
            fresh = m.update_time > 0.0 and now - m.update_time <= staleness
            memo[ep.id] = (m, m.update_time + staleness if fresh else math.inf, value)
            out.append(value)
        return out

    def rooms(
        self, endpoints: Sequence[Endpoint], now: float, max_usage: float = 1.0
    ) -> list[float | None]:
        """Tokens each endpoint can still take: ``max_usage * capacity - demand`` (``demand_now``
        in tokens); None without a KV size. Kept per endpoint as ``usages`` keeps its value."""
        memo = self._room_memo
        out: list[float | None] = []
        for ep in endpoints:
            m = ep.metrics
            held = memo.get(ep.id)
            if held is not None and held[0] is m and now <= held[1] and held[2] == max_usage:
                out.append(held[3])
                continue
            capacity = capacity_tokens(ep)
            room: float | None = None
            until = math.inf
            if m is not None and capacity > 0:
                demand = max(usage_now(ep, now, self) * capacity, self.in_flight(ep.id))
                room = max_usage * capacity - demand
                if m.update_time > 0.0 and now - m.update_time <= self.horizon:
                    until = m.update_time + self.horizon
            memo[ep.id] = (m, until, max_usage, room)
            out.append(room)
        return out

    def _drop_memos(self, endpoint_id: str) -> None:
        """The endpoint's records changed: its memos no longer hold."""
        self._usage_memo.pop(endpoint_id, None)
        self._room_memo.pop(endpoint_id, None)

    def _forget(self, request_id: str) -> _Open | None:
        entry = self._open.pop(request_id, None)
        if entry is not None:
            eid = entry.endpoint
            self._drop_memos(eid)
            since = self._since.get(eid)
            if since is not None and entry.sent > since[0]:
                since[1] -= entry.tokens  # no longer in flight: no longer added
            left = self._in_flight.get(eid, 0) - entry.tokens
            if left > 0:
                self._in_flight[eid] = left
            else:
                self._in_flight.pop(eid, None)
            opened = self._by_endpoint.get(eid)
            if opened is not None:
                opened.pop(request_id, None)
                if not opened:
                    del self._by_endpoint[eid]
        return entry

    def _sweep(self, now: float) -> None:
        """Drop the completion records of endpoints nobody scores any more, and the memos of
        endpoints that left (bounded by ``MAX_OPEN``)."""
        self._swept_at = now
        for endpoint_id in list(self._done):
            done = self._done[endpoint_id]
            if _drop_until(done, now - self.horizon):
                self._since.pop(endpoint_id, None)
            self._drop_memos(endpoint_id)
            if not done:
                del self._done[endpoint_id]
        for endpoint_id in [e for e in self._since if not self.tracks(e)]:
            del self._since[endpoint_id]
        if len(self._usage_memo) + len(self._room_memo) > MAX_OPEN:  # pods that left the pool
            self._usage_memo.clear()
            self._room_memo.clear()


def _drop_until(done: deque[tuple[float, float, int]], until: float) -> bool:
    """Drop the records of completions at or before ``until``; whether any was dropped."""
    dropped = False
    while done and done[0][0] <= until:
        done.popleft()
        dropped = True
    return dropped


def request_kv_tokens(request: InferenceRequest, default_output: int = 0) -> int:
    """Tokens of KV the request will hold at most: its prompt (``flow.prompt_tokens``) and its
    output limit (``default_output`` when it sets none)."""
    body = request.body
    limit = body.max_output_tokens if body is not None else None
    return prompt_tokens(request) + (limit if limit is not None else default_output)


def capacity_tokens(endpoint: Endpoint) -> int:
    """The endpoint's KV cache in tokens (0 when its metrics do not say)."""
    m = endpoint.metrics
    return m.cache_num_blocks * m.cache_block_size if m is not None else 0


def usage_now(
    endpoint: Endpoint, now: float, tracker: KVTracker, staleness: float = STALENESS_SECONDS
) -> float:
    """The endpoint's KV-cache usage now, in [0, 1]; 1 without metrics (module doc)."""
    m = endpoint.metrics
    if m is None:
        return 1.0
    kv = m.kv_cache_usage_percent
    capacity = m.cache_num_blocks * m.cache_block_size
    scraped_at = m.update_time
    if capacity > 0 and scraped_at > 0.0 and now - scraped_at <= staleness:
        change = tracker.change(endpoint.id, scraped_at) if tracker.tracks(endpoint.id) else 0
        if change:
            kv += change / capacity
    return min(1.0, max(0.0, kv)) if kv == kv else 0.0


def demand_now(
    endpoint: Endpoint, now: float, tracker: KVTracker, staleness: float = STALENESS_SECONDS
) -> float:
    """``max(usage_now, in_flight / capacity)``: the KV share the endpoint will hold once this
    EPP's requests there all run (may exceed 1)."""
    usage = usage_now(endpoint, now, tracker, staleness)
    capacity = capacity_tokens(endpoint)
    if capacity <= 0:
        return usage
    return max(usage, tracker.in_flight(endpoint.id) / capacity)
