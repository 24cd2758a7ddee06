"""What ``predicted-latency-producer`` keeps between a request's hooks, per request and per
endpoint, and how well its predictions turned out.

- ``RequestContext``: one request's SLOs, the features and predictions of every candidate, the
  endpoint it was sent to and its timing. It lives on the request (private scratch in
  ``InferenceRequest.attributes``), so it goes away with the request.
- ``RunningRequests``: per endpoint, this EPP's requests dispatched there and not complete, each
  with its TPOT SLO: their count is ``LatencyPredictionInfo.dispatched_request_count`` and the
  tightest positive SLO among them bounds a new request's TPOT headroom there (a new request
  must not slow the batch below what its members were promised). It also sums the uncached
  prompt tokens of those without a first token yet (the prefill queued ahead of a new request,
  which the in-process model reads; a model server answers the response headers at once, so
  the in-flight producer's count, released there, misses it). Completion removes a request;
  one older than ``contextTTL`` is dropped anyway (upstream's context cache expiry), so a
  completion that never comes cannot leak.
- ``ErrorStats``: prediction error of the chosen endpoint's prediction against what was measured,
  over every graded request, with the percentiles of the last ``window``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from epp.plugins.producers.predicted_latency.features import Features


@dataclass(slots=True)
class RequestContext:
    ttft_slo: float
    tpot_slo: float
    features: dict[str, Features]
    predictions: dict[str, tuple[float, float]] = field(default_factory=dict)
    target: str = ""
    ttft_endpoint: str = ""
    """Where the TTFT is incurred: the prefill endpoint when disaggregated, else ``target``."""
    dispatched_at: float = 0.0
    first_chunk_at: float = 0.0
    chunks: int = 0


class RunningRequests:
    """Endpoint id → {request id: (TPOT SLO, dispatch time)} of requests not complete."""

    def __init__(self) -> None:
        self._by_endpoint: dict[str, dict[str, tuple[float, float]]] = {}
        self._min: dict[str, float] = {}
        self._where: dict[str, str] = {}
        self._prefill_of: dict[str, int] = {}
        self._prefill: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._where)

    def add(
        self, endpoint_id: str, request_id: str, tpot_slo: float, now: float, prefill: int = 0
    ) -> None:
        """A request dispatched to ``endpoint_id``, with ``prefill`` uncached prompt tokens the
        endpoint has still to compute for it."""
        self.remove(request_id)
        self._by_endpoint.setdefault(endpoint_id, {})[request_id] = (tpot_slo, now)
        self._where[request_id] = endpoint_id
        if tpot_slo > 0 and endpoint_id in self._min:
            self._min[endpoint_id] = min(self._min[endpoint_id], tpot_slo)
        if prefill > 0:
            self._prefill_of[request_id] = prefill
            self._prefill[endpoint_id] = self._prefill.get(endpoint_id, 0) + prefill

    def prefilled(self, request_id: str) -> None:
        """The request's first token came: its prompt is no longer pending prefill."""
        tokens = self._prefill_of.pop(request_id, 0)
        if tokens:
            endpoint_id = self._where[request_id]
            left = self._prefill[endpoint_id] - tokens
            if left > 0:
                self._prefill[endpoint_id] = left
            else:
                del self._prefill[endpoint_id]

    def pending_prefill(self, endpoint_id: str) -> int:
        """Uncached prompt tokens of this EPP's requests there that have no first token yet."""
        return self._prefill.get(endpoint_id, 0)

    def remove(self, request_id: str) -> None:
        self.prefilled(request_id)
        endpoint_id = self._where.pop(request_id, None)
        if endpoint_id is None:
            return
        running = self._by_endpoint[endpoint_id]
        slo, _ = running.pop(request_id)
        if not running:
            del self._by_endpoint[endpoint_id]
            self._min.pop(endpoint_id, None)
        elif slo > 0 and self._min.get(endpoint_id) == slo:
            del self._min[endpoint_id]  # recomputed when next asked

    def count(self, endpoint_id: str) -> int:
        return len(self._by_endpoint.get(endpoint_id, ()))

    def min_tpot_slo(self, endpoint_id: str) -> float:
        """The tightest positive TPOT SLO among the endpoint's running requests; 0 if none."""
        value = self._min.get(endpoint_id)
        if value is None:
            running = self._by_endpoint.get(endpoint_id)
            if not running:
                return 0.0
            value = min((slo for slo, _ in running.values() if slo > 0), default=math.inf)
            self._min[endpoint_id] = value
        return value if math.isfinite(value) else 0.0

    def expire(self, now: float, ttl: float) -> int:
        """Drop requests dispatched more than ``ttl`` seconds ago; how many."""
        old = [
            request_id
            for running in self._by_endpoint.values()
            for request_id, (_, at) in running.items()
            if now - at > ttl
        ]
        for request_id in old:
            self.remove(request_id)
        return len(old)

    def state(self, limit: int) -> list[dict[str, Any]]:
        """The busiest ``limit`` endpoints: running count and tightest TPOT SLO."""
        busiest = sorted(self._by_endpoint.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        return [
            {
                "endpoint": endpoint_id,
                "runningRequests": len(running),
                "minTpotSlo": self.min_tpot_slo(endpoint_id),
            }
            for endpoint_id, running in busiest[:limit]
        ]


class ErrorStats:
    """Absolute and relative error of predictions against measurements (milliseconds)."""

    def __init__(self, window: int = 2000) -> None:
        self.n = 0
        self._abs = 0.0
        self._signed = 0.0
        self._pct = 0.0
        self._pct_n = 0
        self._recent: deque[float] = deque(maxlen=window)

    def add(self, predicted: float, actual: float) -> None:
        err = predicted - actual
        self.n += 1
        self._abs += abs(err)
        self._signed += err
        if actual > 0:
            pct = abs(err) / actual
            self._pct += pct
            self._pct_n += 1
            self._recent.append(pct)

    def state(self) -> dict[str, float]:
        if not self.n:
            return {"n": 0}
        recent = sorted(self._recent)

        def pct(q: float) -> float:
            return recent[min(len(recent) - 1, int(q * len(recent)))] if recent else 0.0

        return {
            "n": self.n,
            "maeMs": self._abs / self.n,
            "biasMs": self._signed / self.n,
            "mape": self._pct / self._pct_n if self._pct_n else 0.0,
            "p50AbsPctError": pct(0.5),
            "p90AbsPctError": pct(0.9),
        }
