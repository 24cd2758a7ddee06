"""``slo-headroom-tier-filter``: keep the endpoints predicted to meet the request's latency SLOs.

Reads ``LatencyPredictionInfo/<producer>`` (``epp.plugin.latency``) and splits the candidates::

    positive tier: ttft_headroom >= 0 and tpot_headroom >= 0
    negative tier: any headroom < 0, and every endpoint without a prediction

- both tiers non-empty: the positive tier, except with probability ``epsilonExploreNeg`` (a draw
  from the cycle's random source) the negative one, so that an endpoint recovering from overload
  still gets the odd request and its state is measured again;
- one tier: that tier;
- no prediction at all (no producer ran, the predictor failed or is still learning), or at most
  one candidate: every candidate.

Without an SLO header every headroom is negative (0 minus the prediction): all endpoints are in
the negative tier and the filter keeps them all.

Parameters (upstream's):

- ``epsilonExploreNeg`` (float, default 0.01, in [0, 1]).
- ``latencyPredictionInfoProducerName`` (string, default ``predicted-latency-producer``): the
  producer whose predictions are read.

YAML::

    plugins:
      - type: slo-headroom-tier-filter
        name: slo-tier
        parameters: {epsilonExploreNeg: 0.01}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: slo-tier
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import CycleState, DataKey, Endpoint, Handle, InferenceRequest, PluginBase
from epp.plugin.latency import (
    LATENCY_PREDICTION_INFO,
    PREDICTED_LATENCY_PRODUCER,
    LatencyPredictionInfo,
)


class SLOHeadroomTierFilter(PluginBase):
    TYPE: ClassVar[str] = "slo-headroom-tier-filter"

    @dataclass(frozen=True)
    class Params:
        epsilon_explore_neg: float = 0.01
        latency_prediction_info_producer_name: str = ""

        def __post_init__(self) -> None:
            if not 0.0 <= self.epsilon_explore_neg <= 1.0:
                raise ValueError(
                    f"epsilonExploreNeg must be in [0, 1], got {self.epsilon_explore_neg}"
                )

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        producer = self.params.latency_prediction_info_producer_name or PREDICTED_LATENCY_PRODUCER
        self._key = LATENCY_PREDICTION_INFO.key(producer)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if len(endpoints) <= 1:
            return endpoints
        infos: Mapping[str, LatencyPredictionInfo] | None = request.attributes.get(self._key)
        if not infos:
            return endpoints
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        for endpoint in endpoints:
            info = infos.get(endpoint.id)
            if info is not None and info.ttft_headroom >= 0 and info.tpot_headroom >= 0:
                positive.append(endpoint)
            else:
                negative.append(endpoint)
        if len(negative) == len(endpoints) and not any(e.id in infos for e in endpoints):
            return endpoints  # no candidate has a prediction
        if positive and negative:
            if cycle.rng.random() < self.params.epsilon_explore_neg:
                return negative
            return positive
        return positive or negative
