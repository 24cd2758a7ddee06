"""``utilization-filter`` (alpha): drop endpoints over a utilization cap.

Each condition caps one metric; an endpoint is kept only when it satisfies every condition
(``value <= maxValue``), and dropped as soon as one metric exceeds its cap. Several conditions
are therefore an OR of overload rules: ``running-requests <= 40`` and ``waiting-queue <= 0`` drop
an endpoint with more than 40 running requests *or* a non-empty queue. Metrics:

* ``active-requests``: the requests this EPP routed to the endpoint and has not seen complete
  (running and queued alike), from ``InFlightLoad/<inFlightLoadProducerName>`` of
  ``inflight-load-producer`` (created by the loader when no config declares it; the key is
  consumed only when a condition uses this metric);
* ``running-requests``, ``waiting-queue``: the model server's scraped running requests and
  waiting queue;
* ``kv-cache-utilization``: its scraped KV-cache usage, a fraction in [0, 1].

An endpoint missing a metric (never scraped, or not in the in-flight data) counts as 0 for it, as
upstream: a new endpoint is not filtered out for want of numbers. When every endpoint is dropped
and ``fallbackOnEmpty`` is true the candidates are returned unfiltered, so the request can still
be routed; otherwise the profile has no candidates (upstream's 429 ``rejected-saturated``).

Parameters:

* ``conditions`` (required, at least one): ``[{metric, maxValue}]``; ``metric`` one of the four
  above, ``maxValue`` (required) >= 0, and at most 1 for ``kv-cache-utilization``;
* ``fallbackOnEmpty`` (false);
* ``inFlightLoadProducerName`` (``inflight-load-producer``): ``active-requests`` only.

YAML::

    plugins:
      - type: utilization-filter
        name: drop-overloaded-endpoints
        parameters:
          conditions:
            - {metric: running-requests, maxValue: 40}
            - {metric: waiting-queue, maxValue: 0}
            - {metric: kv-cache-utilization, maxValue: 0.8}
          fallbackOnEmpty: true
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: drop-overloaded-endpoints
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    Metrics,
    PluginBase,
    Stability,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad

ACTIVE_REQUESTS: Final = "active-requests"
DEFAULT_PRODUCER: Final = "inflight-load-producer"
_SCRAPED: Final[dict[str, Callable[[Metrics], float]]] = {
    "running-requests": lambda m: float(m.running_requests_size),
    "waiting-queue": lambda m: float(m.waiting_queue_size),
    "kv-cache-utilization": lambda m: m.kv_cache_usage_percent,
}
METRICS: Final = (ACTIVE_REQUESTS, *_SCRAPED)


@dataclass(frozen=True)
class Condition:
    metric: str = ""
    max_value: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ValueError(
                f"utilization filter condition metric must be one of {', '.join(METRICS)}, "
                f"got {self.metric!r}"
            )
        if self.max_value is None:
            raise ValueError(f"utilization filter condition for {self.metric!r} requires maxValue")
        if self.max_value < 0:
            raise ValueError(
                f"utilization filter condition for {self.metric!r} requires a non-negative "
                f"maxValue, got {self.max_value}"
            )
        if self.metric == "kv-cache-utilization" and self.max_value > 1:
            raise ValueError(
                "utilization filter maxValue for 'kv-cache-utilization' is a fraction and must "
                f"be at most 1, got {self.max_value}"
            )


class UtilizationFilter(PluginBase):
    TYPE: ClassVar[str] = "utilization-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        conditions: tuple[Condition, ...] = ()
        fallback_on_empty: bool = False
        in_flight_load_producer_name: str = DEFAULT_PRODUCER

        def __post_init__(self) -> None:
            if not self.conditions:
                raise ValueError("utilization filter requires at least one condition")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._key = INFLIGHT_LOAD.key(params.in_flight_load_producer_name or DEFAULT_PRODUCER)
        caps = [(c.metric, float(c.max_value or 0.0)) for c in params.conditions]
        self._active_cap = min((cap for m, cap in caps if m == ACTIVE_REQUESTS), default=None)
        self._scraped = tuple((_SCRAPED[m], cap) for m, cap in caps if m != ACTIVE_REQUESTS)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key}) if self._active_cap is not None else frozenset()

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        loads: Mapping[str, InFlightLoad] = {}
        if self._active_cap is not None:
            loads = request.attributes.get(self._key) or {}
        kept = [e for e in endpoints if self._within(e, loads)]
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept

    def _within(self, endpoint: Endpoint, loads: Mapping[str, InFlightLoad]) -> bool:
        cap = self._active_cap
        if cap is not None:
            load = loads.get(endpoint.id)
            if load is not None and load.requests > cap:
                return False
        m = endpoint.metrics
        if m is None:
            return True  # every scraped metric counts as 0
        return not any(value(m) > limit for value, limit in self._scraped)  # NaN passes, as Go
