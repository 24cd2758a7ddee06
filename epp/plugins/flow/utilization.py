"""``utilization-detector``: pool saturation from queue depth and KV-cache use (default detector).

Per endpoint, with ``q = waiting_queue_size`` and ``kv`` its KV use as of now::

    saturation(ep) = max(q / queueDepthThreshold, kv / kvCacheUtilThreshold)

Upstream's ``kv`` is the scraped ``kv_cache_usage_percent``, up to a scrape interval old. Here it
is also what this EPP sent there since: the scrape corrected by this EPP's dispatches and
completions since it was taken, and at least the KV this EPP's requests in flight there will hold
(prompt and output limit, whether the server runs them yet or still queues them), as
``epp.plugin.kvusage.demand_now`` defines it; with flow control, requests dispatched but not yet
scheduled (``reserve``) add their KV spread evenly over the candidates. So a burst of dispatches
shows at once, not a scrape later, and a pool whose KV this EPP has already promised reads as
full: flow control holds requests back instead of sending pods into preemption. Without a KV size
(``cache_config_info``) or this EPP's traffic, ``kv`` is upstream's.
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
from typing import Any, ClassVar

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.kvusage import KVTracker, capacity_tokens, request_kv_tokens
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

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.tracker = KVTracker()
        self._reserved: dict[int, tuple[InferenceRequest, int]] = {}  # by object identity
        self._reserved_tokens = 0

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        if self.params.staleness_policy != SATURATED:
            endpoints = [ep for ep in endpoints if not self._is_stale(now, ep)]
            if not endpoints:
                return 0.0
        kv = self._kv(now, endpoints, self._reserved_tokens / len(endpoints))
        total = sum(
            self._endpoint_saturation(now, ep, k) for ep, k in zip(endpoints, kv, strict=True)
        )
        return total / len(endpoints)

    # ---- what this EPP sent: PreRequest, ResponseComplete, ReservingDetector -------------------

    def reserve(self, request: InferenceRequest) -> None:
        if id(request) not in self._reserved:
            tokens = request_kv_tokens(request)
            self._reserved[id(request)] = (request, tokens)
            self._reserved_tokens += tokens

    def release(self, request: InferenceRequest) -> None:
        held = self._reserved.pop(id(request), None)
        if held is not None:
            self._reserved_tokens -= held[1]
        self.tracker.complete(request.request_id, self.handle.clock(), 0)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        held = self._reserved.pop(id(request), None)  # bound to its endpoint from now on
        if held is not None:
            self._reserved_tokens -= held[1]
        targets = result.primary.targets
        if targets:
            tokens = request_kv_tokens(request)
            self.tracker.dispatch(request.request_id, targets[0].id, self.handle.clock(), tokens)

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        return False  # ResponseBodyNeed: without usage, the prompt's tokens are released

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        usage = response.usage
        held = usage.prompt_tokens + usage.completion_tokens if usage.prompt_tokens else 0
        self.tracker.complete(request.request_id, self.handle.clock(), held)

    def _kv(self, now: float, endpoints: Sequence[Endpoint], spread: float) -> list[float]:
        """Each endpoint's KV use as of now (module doc); ``spread`` reserved tokens each."""
        tracker = self.tracker
        out = tracker.usages(endpoints, now)
        for i, ep in enumerate(endpoints):
            capacity = capacity_tokens(ep)
            if capacity > 0:
                own = tracker.in_flight(ep.id)
                out[i] = max(out[i], own / capacity) + spread / capacity
            elif ep.metrics is not None:
                out[i] = ep.metrics.kv_cache_usage_percent
        return out

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        p = self.params
        queue_limit = p.queue_depth_threshold * (1.0 + p.headroom)
        kv_limit = min(1.0, p.kv_cache_util_threshold * (1.0 + p.headroom))
        kv = self._kv(cycle.now, endpoints, 0.0)
        kept = [
            ep
            for ep, k in zip(endpoints, kv, strict=True)
            if ep.metrics is not None
            and not self._is_stale(cycle.now, ep)
            and ep.metrics.waiting_queue_size <= queue_limit
            and k <= kv_limit
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

    def _endpoint_saturation(self, now: float, endpoint: Endpoint, kv: float) -> float:
        metrics = endpoint.metrics
        if metrics is None or self._is_stale(now, endpoint):
            return 1.0
        p = self.params
        return max(
            metrics.waiting_queue_size / p.queue_depth_threshold, kv / p.kv_cache_util_threshold
        )

    def _is_stale(self, now: float, endpoint: Endpoint) -> bool:
        return endpoint.metrics is None or (
            now - endpoint.metrics.update_time > self.params.staleness_seconds
        )
