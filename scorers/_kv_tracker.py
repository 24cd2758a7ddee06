"""What this EPP's own requests changed in each endpoint's KV cache since the endpoint's last
scrape (used by ``kv-cache-utilization-scorer``, see that module's docstring).

A request is recorded at dispatch (endpoint, dispatch time, prompt tokens) and at completion
(completion time, the tokens it held: the server's reported prompt + completion tokens, else its
prompt tokens). ``change(endpoint, t)`` is, in tokens, what the dispatches after ``t`` still in
flight added, minus what requests dispatched at or before ``t`` and completed after ``t`` held.

Memory is bounded: at most ``MAX_OPEN`` requests in flight (the oldest forgotten first) and, per
endpoint, at most ``MAX_DONE`` completion records, each dropped once a scrape after it has been
used (that scrape saw the completion) or once older than ``horizon`` seconds (a scrape that old
is not corrected).
"""

from __future__ import annotations

from collections import deque
from typing import Final, NamedTuple

MAX_OPEN: Final = 65536
MAX_DONE: Final = 4096


class _Open(NamedTuple):
    endpoint: str
    sent: float
    tokens: int


class KVTracker:
    def __init__(self, horizon: float) -> None:
        self.horizon = horizon
        self._open: dict[str, _Open] = {}  # request id → record, in dispatch order
        # endpoint id → {request id: (dispatch time, tokens)}, in dispatch order
        self._by_endpoint: dict[str, dict[str, tuple[float, int]]] = {}
        # endpoint id → (completion time, dispatch time, tokens), in completion order
        self._done: dict[str, deque[tuple[float, float, int]]] = {}
        self._swept_at = 0.0

    def __len__(self) -> int:
        return len(self._open)

    def dispatch(self, request_id: str, endpoint_id: str, now: float, tokens: int) -> None:
        if request_id in self._open:
            return
        if len(self._open) >= MAX_OPEN:
            oldest = next(iter(self._open))
            self._forget(oldest)
        self._open[request_id] = _Open(endpoint_id, now, tokens)
        self._by_endpoint.setdefault(endpoint_id, {})[request_id] = (now, tokens)

    def complete(self, request_id: str, now: float, held_tokens: int) -> None:
        """Record a completion; ``held_tokens`` 0 = the tokens recorded at dispatch."""
        entry = self._forget(request_id)
        if entry is None:
            return
        done = self._done.get(entry.endpoint)
        if done is None:
            done = self._done[entry.endpoint] = deque(maxlen=MAX_DONE)
        done.append((now, entry.sent, held_tokens or entry.tokens))
        _drop_until(done, now - self.horizon)
        if now - self._swept_at > self.horizon:
            self._sweep(now)

    def endpoints(self) -> frozenset[str]:
        """The endpoints ``change`` may be non-zero for (all others: 0, with nothing to drop)."""
        if not self._done:
            return frozenset(self._by_endpoint)
        return frozenset(self._by_endpoint).union(self._done)

    def change(self, endpoint_id: str, scraped_at: float) -> int:
        """Tokens this EPP added minus released on ``endpoint_id`` since ``scraped_at``."""
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
        return added - released

    def _forget(self, request_id: str) -> _Open | None:
        entry = self._open.pop(request_id, None)
        if entry is not None:
            opened = self._by_endpoint.get(entry.endpoint)
            if opened is not None:
                opened.pop(request_id, None)
                if not opened:
                    del self._by_endpoint[entry.endpoint]
        return entry

    def _sweep(self, now: float) -> None:
        """Drop the completion records of endpoints nobody scores any more."""
        self._swept_at = now
        for endpoint_id in list(self._done):
            done = self._done[endpoint_id]
            _drop_until(done, now - self.horizon)
            if not done:
                del self._done[endpoint_id]


def _drop_until(done: deque[tuple[float, float, int]], until: float) -> None:
    while done and done[0][0] <= until:
        done.popleft()
