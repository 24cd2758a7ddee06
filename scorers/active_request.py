"""``active-request-scorer``: prefer endpoints with fewer requests in flight from this EPP
(Distribution).

Reads ``InFlightLoad/<inFlightLoadProducerName>`` (from ``inflight-load-producer``, created
automatically when missing). With ``c`` an endpoint's in-flight requests and ``M`` the largest
``c`` among the candidates::

    c <= idleThreshold  -> 1.0
    otherwise           -> (M - c) / M * maxBusyScore

Unlike scraped queue lengths, in-flight counts change the moment a request is scheduled, so a
burst of requests inside one scrape interval is spread instead of piled onto one pod.

Parameters: ``idleThreshold`` (0), ``maxBusyScore`` (1.0, in [0, 1]),
``inFlightLoadProducerName`` (``inflight-load-producer``), ``requestTimeout`` (deprecated,
accepted and ignored as upstream).

YAML::

    - type: active-request-scorer
      parameters: {idleThreshold: 0, maxBusyScore: 1.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import CycleState, DataKey, Endpoint, InferenceRequest, PluginBase, ScorerCategory
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad


class ActiveRequestScorer(PluginBase):
    TYPE: ClassVar[str] = "active-request-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        idle_threshold: int = 0
        max_busy_score: float = 1.0
        in_flight_load_producer_name: str = "inflight-load-producer"
        request_timeout: str = ""

        def __post_init__(self) -> None:
            if self.idle_threshold < 0:
                raise ValueError("idleThreshold must be >= 0")
            if not 0.0 <= self.max_busy_score <= 1.0:
                raise ValueError("maxBusyScore must be in [0, 1]")

    params: Params

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({INFLIGHT_LOAD.key(self.params.in_flight_load_producer_name)})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        loads: Mapping[str, InFlightLoad] = (
            request.attributes.get(INFLIGHT_LOAD.key(self.params.in_flight_load_producer_name))
            or {}
        )
        counts = {e.id: loads[e.id].requests if e.id in loads else 0 for e in endpoints}
        top = max(counts.values(), default=0)
        idle, busy = self.params.idle_threshold, self.params.max_busy_score
        return {
            eid: 1.0 if c <= idle or top == 0 else (top - c) / top * busy
            for eid, c in counts.items()
        }
