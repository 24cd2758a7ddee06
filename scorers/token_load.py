"""``token-load-scorer``: prefer endpoints with fewer uncached prompt tokens in flight from this
EPP (Distribution).

Reads ``InFlightLoad/<inFlightLoadProducerName>``. With ``t`` an endpoint's in-flight tokens::

    score = 1 - min(1, t / queueThresholdTokens)

Parameters: ``queueThresholdTokens`` (4194304, > 0), ``inFlightLoadProducerName``
(``inflight-load-producer``).

YAML::

    - type: token-load-scorer
      parameters: {queueThresholdTokens: 1000000}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import CycleState, DataKey, Endpoint, InferenceRequest, PluginBase, ScorerCategory
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad


class TokenLoadScorer(PluginBase):
    TYPE: ClassVar[str] = "token-load-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        queue_threshold_tokens: int = 4194304
        in_flight_load_producer_name: str = "inflight-load-producer"

        def __post_init__(self) -> None:
            if self.queue_threshold_tokens <= 0:
                raise ValueError("queueThresholdTokens must be > 0")

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
        limit = self.params.queue_threshold_tokens
        return {
            e.id: 1.0 - min(1.0, loads[e.id].tokens / limit) if e.id in loads else 1.0
            for e in endpoints
        }
