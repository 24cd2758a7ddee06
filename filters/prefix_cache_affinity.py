"""``prefix-cache-affinity-filter``: keep the endpoints that already cache most of the prompt,
unless they are so loaded that a cold endpoint would answer sooner.

``prefix-cache-scorer`` under ``max-score-picker`` sends every request of a shared prompt to the
one best-cached endpoint (hot spots); under ``weighted-random-picker`` it often sends them where
nothing is cached. This filter narrows the candidates to the *sticky* endpoints first and lets the
scorers and picker after it spread the load among them::

    score(ep)  = match_blocks / total_blocks        (PrefixCacheMatchInfo/<prefix producer>)
    sticky     = {ep : score(ep) >= affinityThreshold}

- at most one candidate, or ``affinityThreshold <= 0``: every candidate;
- with probability ``explorationProbability`` (a draw from the cycle's random source): every
  candidate, so that other endpoints warm their caches over time;
- no sticky endpoint: every candidate;
- TTFT load gate (``maxTTFTPenaltyMs`` > 0, and some candidates are not sticky): when
  ``min TTFT(sticky) - min TTFT(non-sticky) > maxTTFTPenaltyMs`` stickiness is broken and every
  candidate is kept. ``TTFT(ep)`` is, with ``ttftSource: prefillThroughput`` (the default),
  ``inFlightTokens(ep) / peakPrefillThroughput * 1000`` ms (``InFlightLoad/<in-flight
  producer>``: the uncached prompt tokens this EPP has in flight there; 0 without data), and with
  ``ttftSource: latencyPredictor`` the predicted TTFT (``LatencyPredictionInfo/<producer>``; an
  endpoint without a prediction counts as infinitely slow, so a gate with no prediction on either
  side stays shut);
- otherwise: the sticky endpoints.

It can be configured twice with different thresholds (llm-d's latency-predictor profile runs a
strict 0.99 gate before ``slo-headroom-tier-filter`` and a loose 0.80 one after it).

Parameters (upstream's):

- ``affinityThreshold`` (float, default 0.80, <= 1).
- ``explorationProbability`` (float, default 0, in [0, 1]).
- ``maxTTFTPenaltyMs`` (float, default 18000, >= 0; 0: always stick).
- ``ttftSource`` (``prefillThroughput`` | ``latencyPredictor``, default ``prefillThroughput``).
- ``peakPrefillThroughput`` (float, tokens/s, default 15928, >= 0; > 0 when the gate uses it).
  Upstream calibrated it for Qwen 32B on 2x H100 (TP 2) with vLLM 0.19; retune it, or use the
  predictor.
- ``prefixMatchInfoProducerName`` (default ``approx-prefix-cache-producer``),
  ``latencyPredictionInfoProducerName`` (default ``predicted-latency-producer``),
  ``inFlightLoadProducerName`` (default ``inflight-load-producer``): whose data is read.

YAML::

    plugins:
      - type: prefix-cache-affinity-filter
        name: prefix-affinity
        parameters:
          affinityThreshold: 0.80
          explorationProbability: 0.01
          maxTTFTPenaltyMs: 5000
          ttftSource: prefillThroughput
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: prefix-affinity
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from epp.plugin import (
    PREFIX_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.latency import (
    LATENCY_PREDICTION_INFO,
    PREDICTED_LATENCY_PRODUCER,
    LatencyPredictionInfo,
    prefix_score,
)


class PrefixCacheAffinityFilter(PluginBase):
    TYPE: ClassVar[str] = "prefix-cache-affinity-filter"

    @dataclass(frozen=True)
    class Params:
        affinity_threshold: float = 0.80
        exploration_probability: float = 0.0
        max_ttft_penalty_ms: float = field(default=18000.0, metadata={"yaml": "maxTTFTPenaltyMs"})
        ttft_source: Literal["prefillThroughput", "latencyPredictor"] = "prefillThroughput"
        peak_prefill_throughput: float = 15928.0
        prefix_match_info_producer_name: str = ""
        latency_prediction_info_producer_name: str = ""
        in_flight_load_producer_name: str = ""

        def __post_init__(self) -> None:
            if self.affinity_threshold > 1.0:
                raise ValueError(f"affinityThreshold must be <= 1.0, got {self.affinity_threshold}")
            if not 0.0 <= self.exploration_probability <= 1.0:
                raise ValueError(
                    f"explorationProbability must be in [0, 1], got {self.exploration_probability}"
                )
            if self.max_ttft_penalty_ms < 0:
                raise ValueError(f"maxTTFTPenaltyMs must be >= 0, got {self.max_ttft_penalty_ms}")
            if self.peak_prefill_throughput < 0:
                raise ValueError(
                    f"peakPrefillThroughput must be >= 0, got {self.peak_prefill_throughput}"
                )
            if (
                self.ttft_source == "prefillThroughput"
                and self.max_ttft_penalty_ms > 0
                and self.peak_prefill_throughput == 0
            ):
                raise ValueError(
                    "peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput"
                )

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self._prefix_key = PREFIX_MATCH_INFO.key(
            p.prefix_match_info_producer_name or "approx-prefix-cache-producer"
        )
        self._latency_key = LATENCY_PREDICTION_INFO.key(
            p.latency_prediction_info_producer_name or PREDICTED_LATENCY_PRODUCER
        )
        self._load_key = INFLIGHT_LOAD.key(
            p.in_flight_load_producer_name or "inflight-load-producer"
        )
        self._predictor = p.ttft_source == "latencyPredictor"

    def consumes(self) -> frozenset[DataKey[Any]]:
        keys: set[DataKey[Any]] = {self._prefix_key}
        if self.params.max_ttft_penalty_ms > 0:
            keys.add(self._latency_key if self._predictor else self._load_key)
        return frozenset(keys)

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        p = self.params
        if len(endpoints) <= 1 or p.affinity_threshold <= 0:
            return endpoints
        if p.exploration_probability > 0 and cycle.rng.random() < p.exploration_probability:
            return endpoints
        infos: Mapping[str, PrefixMatchInfo] | None = request.attributes.get(self._prefix_key)
        sticky = [e for e in endpoints if prefix_score(infos, e.id) >= p.affinity_threshold]
        if not sticky:
            return endpoints
        if p.max_ttft_penalty_ms > 0 and len(sticky) < len(endpoints):
            ids = {e.id for e in sticky}
            others = [e for e in endpoints if e.id not in ids]
            ttft = self._ttft_of(request)
            if min(map(ttft, sticky)) - min(map(ttft, others)) > p.max_ttft_penalty_ms:
                return endpoints
        return sticky

    def _ttft_of(self, request: InferenceRequest) -> Callable[[Endpoint], float]:
        """The TTFT estimate (ms) of an endpoint, from the configured source."""
        if self._predictor:
            predictions: Mapping[str, LatencyPredictionInfo] = (
                request.attributes.get(self._latency_key) or {}
            )

            def predicted(endpoint: Endpoint) -> float:
                info = predictions.get(endpoint.id)
                return info.ttft if info is not None else math.inf

            return predicted
        loads: Mapping[str, InFlightLoad] = request.attributes.get(self._load_key) or {}
        rate = self.params.peak_prefill_throughput

        def from_tokens(endpoint: Endpoint) -> float:
            load = loads.get(endpoint.id)
            return (load.tokens if load is not None else 0) / rate * 1000.0

        return from_tokens
