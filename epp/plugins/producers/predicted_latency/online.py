"""The in-process latency model: per-endpoint online linear regression (recursive least squares).

Used when no latency-predictor sidecar is configured. Two targets are modelled, TTFT and TPOT
(milliseconds; in non-streaming mode the first target is the end-to-end latency, as upstream
trains it), each on its feature vector (``features``). Per target:

- a *pooled* model learns from every endpoint's observations;
- each endpoint gets its own model at its first observation, a copy of the pooled one as it is
  then (so it starts from what the pool knows and adapts to that endpoint: a slower GPU, a pod
  that others also send to);
- a prediction uses the endpoint's model once it has learned from ``min_samples`` observations of
  its own, the pooled one before; none until the pooled model has learned from ``min_samples``
  observations (the consumers then fall back to scraped metrics).

Recursive least squares with forgetting factor ``lam`` minimises
``sum lam^(n-i) (y_i - w.x_i)^2 / y_i`` (each observation weighted ``1/y``, by scaling ``x`` and
``y`` with ``1/sqrt(y)``: latencies are heavy-tailed, and unweighted the few long ones set the
intercept so that every short request is predicted far too slow) and costs O(d^2) per
observation (d <= 9)::

    k = P x / (lam + x' P x);   w += k (y - w.x);   P = (P - k (P x)') / lam

``P`` starts at ``1e5 I`` (a weak prior). Forgetting stops while ``trace(P)`` exceeds
``MAX_TRACE`` (a feature that stopped varying would otherwise blow ``P`` up), and a model whose
numbers are no longer finite starts again. Predictions are clamped at 0.

Training is off the request path: completions only append an ``Observation`` to a bounded queue
(the oldest is dropped when it is full, and counted); ``drain`` applies the queue, called by the
producer's training task every ``trainingInterval``. Prediction reads the weights: a dot product
per candidate. Memory: the queue bound plus ``max_endpoints`` models of d^2 + d floats per target
(the least recently trained is dropped past it).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from operator import mul
from typing import Final

INITIAL_P: Final = 1e5
MAX_TRACE: Final = 1e9
MIN_WEIGHTED_MS: Final = 1.0
"""Observations under 1 ms weigh as much as 1 ms ones."""


class RLS:
    """One linear model ``y = w.x``, trained one observation at a time."""

    __slots__ = ("dim", "lam", "p", "samples", "w")

    def __init__(self, dim: int, lam: float) -> None:
        self.dim = dim
        self.lam = lam
        self.w: list[float] = []
        self.p: list[list[float]] = []
        self.samples = 0
        self.reset()

    def reset(self) -> None:
        dim = self.dim
        self.w = [0.0] * dim
        self.p = [[INITIAL_P if i == j else 0.0 for j in range(dim)] for i in range(dim)]
        self.samples = 0

    def copy(self) -> RLS:
        """The same weights and covariance, with no samples of its own yet."""
        twin = RLS(self.dim, self.lam)
        twin.w = list(self.w)
        twin.p = [list(row) for row in self.p]
        return twin

    def predict(self, x: Sequence[float]) -> float:
        total: float = sum(map(mul, self.w, x))
        return max(0.0, total)

    def update(self, x: Sequence[float], y: float) -> None:
        p, dim = self.p, self.dim
        px = [sum(row[j] * x[j] for j in range(dim)) for row in p]
        denom = self.lam + sum(x[i] * px[i] for i in range(dim))
        if not denom > 0:
            return
        k = [v / denom for v in px]
        err = y - sum(wi * xi for wi, xi in zip(self.w, x, strict=True))
        self.w = [wi + ki * err for wi, ki in zip(self.w, k, strict=True)]
        trace = sum(p[i][i] for i in range(dim))
        scale = 1.0 / self.lam if trace < MAX_TRACE else 1.0
        for i in range(dim):
            row, ki = p[i], k[i]
            for j in range(dim):
                row[j] = (row[j] - ki * px[j]) * scale
        self.samples += 1
        if not all(math.isfinite(v) for v in self.w):
            self.reset()


class TargetModels:
    """The pooled model and the per-endpoint models of one target."""

    def __init__(self, dim: int, lam: float, min_samples: int, max_endpoints: int) -> None:
        self.pooled = RLS(dim, lam)
        self.endpoints: OrderedDict[str, RLS] = OrderedDict()
        self._min = min_samples
        self._max = max_endpoints

    @property
    def ready(self) -> bool:
        return self.pooled.samples >= self._min

    def predict(self, endpoint_id: str, x: Sequence[float]) -> float | None:
        if not self.ready:
            return None
        model = self.endpoints.get(endpoint_id)
        if model is None or model.samples < self._min:
            model = self.pooled
        return model.predict(x)

    def update(self, endpoint_id: str, x: Sequence[float], y: float) -> None:
        # weight 1/y: x and y scaled by 1/sqrt(y), so a 50 ms error on a 60 ms TTFT counts more
        # than on a 2 s one (latencies are heavy-tailed: unweighted, the long ones set the
        # intercept and every short request is predicted far too slow)
        scale = 1.0 / math.sqrt(max(y, MIN_WEIGHTED_MS))
        x = [v * scale for v in x]
        y = y * scale
        model = self.endpoints.get(endpoint_id)
        if model is None:
            model = self.endpoints[endpoint_id] = self.pooled.copy()
            while len(self.endpoints) > self._max:
                self.endpoints.popitem(last=False)
        else:
            self.endpoints.move_to_end(endpoint_id)
        model.update(x, y)
        self.pooled.update(x, y)


@dataclass(frozen=True, slots=True)
class Observation:
    """One measurement of a completed request: its ``target`` (``ttft`` or ``tpot``), the
    endpoint that incurred it (for TTFT the prefill endpoint when disaggregated), the feature
    vector it was predicted from and the measured milliseconds."""

    target: str
    endpoint_id: str
    x: tuple[float, ...]
    ms: float


class OnlineModel:
    """TTFT and TPOT models and the queue of observations not yet learned from."""

    def __init__(
        self,
        *,
        ttft_dim: int,
        tpot_dim: int,
        lam: float,
        min_samples: int,
        max_endpoints: int,
        max_pending: int,
    ) -> None:
        self.ttft = TargetModels(ttft_dim, lam, min_samples, max_endpoints)
        self.tpot = TargetModels(tpot_dim, lam, min_samples, max_endpoints)
        self.pending: deque[Observation] = deque(maxlen=max_pending)
        self.dropped = 0
        self.learned = 0

    def observe(self, observation: Observation) -> None:
        """Queue an observation (O(1), on the request path)."""
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
        self.pending.append(observation)

    def drain(self, limit: int | None = None) -> int:
        """Learn from up to ``limit`` queued observations (all by default); how many."""
        done = 0
        pending = self.pending
        while pending and (limit is None or done < limit):
            obs = pending.popleft()
            models = self.ttft if obs.target == "ttft" else self.tpot
            models.update(obs.endpoint_id, obs.x, obs.ms)
            done += 1
        self.learned += done
        return done

    def state(self) -> dict[str, int]:
        return {
            "learned": self.learned,
            "pending": len(self.pending),
            "dropped": self.dropped,
            "ttftSamples": self.ttft.pooled.samples,
            "tpotSamples": self.tpot.pooled.samples,
            "endpoints": len(self.ttft.endpoints),
        }
