"""``utilization-detector``: pool saturation from queue depth and KV-cache use (default detector).

Per endpoint, with ``q = waiting_queue_size`` and ``kv = kv_cache_usage_percent``::

    saturation(ep) = max(q / queueDepthThreshold, kv / kvCacheUtilThreshold)
    stale(ep) = ep has no metrics or now - metrics.update_time > metricsStalenessThreshold

    saturation(pool) = mean of saturation(ep) over the candidates   # 1.0 for no candidates

A pool value >= 1.0 means saturated. ``stalenessPolicy`` says what a stale endpoint does:

- ``saturated`` (default, as upstream): it scores 1.0 in the mean (fail closed). When scrapes
  stop, sheddable traffic is shed (and flow control stops dispatching) instead of being routed
  blind; the ``llm_d_epp_flow_control_stale_endpoints`` gauge tells this apart from overload.
- ``ignore`` (upstream's proposed ``stalenessPolicy: ignore``, llm-d-router #2408): it leaves the
  mean; a pool whose candidates are all stale scores 0.0, so a fleet-wide scrape outage does not
  halt dispatch. Stale endpoints are still routed to.
- ``exclude`` (ours): as ``ignore`` for the mean, and stale endpoints also leave the candidates
  every request is scheduled over (whether or not the detector sits in a scheduling profile), so
  a pod whose ``/metrics`` stalls stops receiving traffic within one staleness window. If every
  candidate is stale they are all kept (a scrape outage never fails a request by itself). A pod
  not yet scraped counts as stale, so a new pod takes traffic from its first scrape on.

Placed in a scheduling profile it also acts as a filter: it drops endpoints with stale or missing
metrics and those with ``q > queueDepthThreshold * (1 + headroom)`` or
``kv > min(1, kvCacheUtilThreshold * (1 + headroom))``. If that would drop every endpoint it
returns the candidates unchanged, so the filter alone never fails a request.

Parameters:

- ``queueDepthThreshold`` (int, default 5, > 0): waiting requests at which an endpoint is full.
- ``kvCacheUtilThreshold`` (float, default 0.8, in (0, 1]): KV-cache fraction at which an
  endpoint is full.
- ``metricsStalenessThreshold`` (Go duration string, default ``200ms``, > 0): metrics older than
  this are stale.
- ``stalenessPolicy`` (``saturated`` | ``ignore`` | ``exclude``, default ``saturated``): see above.
- ``headroom`` (float, default 0.0, >= 0): extra room the filter allows above the thresholds.

YAML::

    plugins:
      - type: utilization-detector
        parameters:
          queueDepthThreshold: 8
          kvCacheUtilThreshold: 0.9
          metricsStalenessThreshold: 500ms
          stalenessPolicy: exclude
          headroom: 0.2
    flowControl:
      saturationDetector:
        pluginRef: utilization-detector
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase
from epp.plugin.units import parse_duration

SATURATED, IGNORE, EXCLUDE = "saturated", "ignore", "exclude"
STALENESS_POLICIES = (SATURATED, IGNORE, EXCLUDE)


class UtilizationDetector(PluginBase):
    TYPE: ClassVar[str] = "utilization-detector"

    @dataclass(frozen=True)
    class Params:
        queue_depth_threshold: int = 5
        kv_cache_util_threshold: float = 0.8
        metrics_staleness_threshold: str = "200ms"
        headroom: float = 0.0
        staleness_policy: str = SATURATED
        staleness_seconds: float = field(init=False, default=0.2)

        def __post_init__(self) -> None:
            if self.queue_depth_threshold <= 0:
                raise ValueError(
                    f"queueDepthThreshold must be > 0, got {self.queue_depth_threshold}"
                )
            if not 0.0 < self.kv_cache_util_threshold <= 1.0:
                raise ValueError(
                    f"kvCacheUtilThreshold must be in (0, 1], got {self.kv_cache_util_threshold}"
                )
            if self.headroom < 0.0:
                raise ValueError(f"headroom must be >= 0, got {self.headroom}")
            if self.staleness_policy not in STALENESS_POLICIES:
                raise ValueError(
                    f"stalenessPolicy must be one of {', '.join(STALENESS_POLICIES)}, "
                    f"got {self.staleness_policy!r}"
                )
            seconds = parse_duration(self.metrics_staleness_threshold)
            if seconds <= 0.0:
                raise ValueError(
                    "metricsStalenessThreshold must be > 0, "
                    f"got {self.metrics_staleness_threshold!r}"
                )
            object.__setattr__(self, "staleness_seconds", seconds)

    params: Params

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        if self.params.staleness_policy == SATURATED:
            return sum(self._endpoint_saturation(now, ep) for ep in endpoints) / len(endpoints)
        fresh = [ep for ep in endpoints if not self._is_stale(now, ep)]
        if not fresh:
            return 0.0
        return sum(self._endpoint_saturation(now, ep) for ep in fresh) / len(fresh)

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        p = self.params
        queue_limit = p.queue_depth_threshold * (1.0 + p.headroom)
        kv_limit = min(1.0, p.kv_cache_util_threshold * (1.0 + p.headroom))
        kept = [
            ep
            for ep in endpoints
            if ep.metrics is not None
            and not self._is_stale(cycle.now, ep)
            and ep.metrics.waiting_queue_size <= queue_limit
            and ep.metrics.kv_cache_usage_percent <= kv_limit
        ]
        return kept if kept else list(endpoints)

    # ---- capabilities: StaleEndpointCounter, ConfirmationGrace, CandidateNarrower -------------

    def routable(self, now: float, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if self.params.staleness_policy != EXCLUDE:
            return endpoints
        fresh = [ep for ep in endpoints if not self._is_stale(now, ep)]
        return fresh if fresh else endpoints

    def stale_endpoints(self, now: float, endpoints: Sequence[Endpoint]) -> int:
        return sum(1 for ep in endpoints if self._is_stale(now, ep))

    def confirmation_grace(self) -> float:
        # One scrape tick, the staleness window, and 250 ms for the engine to free the memory.
        return 0.05 + self.params.staleness_seconds + 0.25

    def _endpoint_saturation(self, now: float, endpoint: Endpoint) -> float:
        metrics = endpoint.metrics
        if metrics is None or self._is_stale(now, endpoint):
            return 1.0
        p = self.params
        return max(
            metrics.waiting_queue_size / p.queue_depth_threshold,
            metrics.kv_cache_usage_percent / p.kv_cache_util_threshold,
        )

    def _is_stale(self, now: float, endpoint: Endpoint) -> bool:
        return endpoint.metrics is None or (
            now - endpoint.metrics.update_time > self.params.staleness_seconds
        )
