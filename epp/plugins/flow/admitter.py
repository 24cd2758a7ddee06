"""``probabilistic-admitter``: shed sheddable requests with a probability that grows with load.

Requests with priority >= 0, and requests with no candidate endpoints, are always admitted. For a
sheddable request (priority < 0), with ``q = waiting_queue_size`` and ``kv =
kv_cache_usage_percent`` of each candidate::

    sat = mean over candidates of max(q / queueDepthThreshold, kv / kvCacheUtilThreshold)
          (an endpoint without metrics counts 1.0)
    p   = min(sat ** power * k, 1)

and the request is rejected when a uniform draw in [0, 1) from the cycle's random source is
below ``p``. With the defaults (power 5, k 300) rejection is certain from
``sat = (1/300) ** (1/5) ~ 0.32``.

A rejection is **429** ``ResourceExhausted`` with ``x-llm-d-request-dropped-reason:
rejected-saturated``: the client should back off and retry. (Upstream's director rewraps any
admitter denial as 500 Internal; we keep the status the plugin means.)

Parameters:

- ``queueDepthThreshold`` (int, default 5, > 0).
- ``kvCacheUtilThreshold`` (float, default 0.8, > 0).
- ``power`` (float, default 5.0, > 0), ``k`` (float, default 300.0, > 0).

YAML::

    plugins:
      - type: probabilistic-admitter
        parameters: {power: 4, k: 100}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import (
    CycleState,
    DropReason,
    Endpoint,
    ErrorCode,
    InferenceError,
    InferenceRequest,
    PluginBase,
)


class ProbabilisticAdmitter(PluginBase):
    TYPE: ClassVar[str] = "probabilistic-admitter"

    @dataclass(frozen=True)
    class Params:
        queue_depth_threshold: int = 5
        kv_cache_util_threshold: float = 0.8
        power: float = 5.0
        k: float = 300.0

        def __post_init__(self) -> None:
            for name in ("queue_depth_threshold", "kv_cache_util_threshold", "power", "k"):
                if getattr(self, name) <= 0:
                    raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    params: Params

    def admit(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> InferenceError | None:
        if request.priority >= 0 or not endpoints:
            return None
        sat = self.pool_saturation(endpoints)
        prob = self.rejection_probability(sat)
        if cycle.rng.random() < prob:
            return InferenceError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"probabilistic-admitter: rejected, saturation={sat:.3f} prob={prob:.2f}",
                drop_reason=DropReason.SATURATED,
            )
        return None

    def pool_saturation(self, endpoints: Sequence[Endpoint]) -> float:
        # Not named `saturation`: that would make the admitter look like a saturation detector.
        p = self.params
        total = 0.0
        for ep in endpoints:
            m = ep.metrics
            if m is None:
                total += 1.0
                continue
            total += max(
                m.waiting_queue_size / p.queue_depth_threshold,
                m.kv_cache_usage_percent / p.kv_cache_util_threshold,
            )
        return total / len(endpoints)

    def rejection_probability(self, saturation: float) -> float:
        return min(float(saturation**self.params.power) * self.params.k, 1.0)
