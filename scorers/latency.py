"""``latency-scorer``: prefer endpoints by predicted latency headroom against the request's SLOs
(Balance).

Reads ``LatencyPredictionInfo/<producer>`` (``epp.plugin.latency``: headroom = SLO - predicted,
in ms; an endpoint missing from it counts as headroom 0 on both, as upstream). Every candidate
starts at 0, then exactly one group of them is scored:

1. the *positive* endpoints (both headrooms >= 0, or no prediction), when there are any;
2. else, all being negative, the *idle* ones (``dispatched_request_count == 0``): an idle pod
   absorbs traffic before a struggling one gets more;
3. else the first non-empty of: only TPOT negative, only TTFT negative, both negative (the
   least severe violation first).

Within the group, with ``|h|`` the absolute headroom::

    n_ttft = (|h_ttft| - min) / (max - min)   over the group (0.5 when max == min), same for tpot
    (a, b) = (ttftWeight, tpotWeight) / their sum        ((1, 0) when the sum is 0)
             (0, 1) when only the TPOT headrooms differ, (1, 0) when only the TTFT ones do
    c      = a * n_ttft + b * n_tpot
    score  = min(1, (floor((1 - c) * 100) + 1) / 100)   strategy least: closest to the SLO
             min(1, (floor(c * 100) + 1) / 100)         strategy most: the most headroom

``least`` packs requests onto the endpoints that just meet their SLO and keeps the roomy ones for
later; ``most`` keeps the widest margin. Negative groups are always scored ``least`` (``most``
would pick the most overloaded endpoint). Without an SLO header every headroom is the negated
prediction, so ``least`` routes to the lowest predicted latency.

No predictions at all (no producer ran, the predictor failed, timed out or is still learning):
a composite of the scraped metrics and the prefix cache, with ``q`` the waiting queue::

    (wkv, wq, wp) = (compositeKVWeight, compositeQueueWeight, compositePrefixWeight) / their sum
                    ((1, 0, 0) when the sum is 0)
    score         = round(100 * (wkv * (1 - kv) + wq * (max q - q) / max q + wp * prefix)) / 100
                    ((max q - q) / max q is 1 when no endpoint queues)

with ``prefix`` = match / total blocks from ``PrefixCacheMatchInfo/<prefix producer>``.

Parameters (upstream's):

- ``ttftWeight`` (float, default 0.8, >= 0), ``tpotWeight`` (float, default 0.2, >= 0; 0 for
  non-streamed traffic).
- ``headroomSelectionStrategy`` (``least`` | ``most``, default ``least``).
- ``compositeKVWeight``, ``compositeQueueWeight``, ``compositePrefixWeight`` (float, default 1,
  >= 0).
- ``latencyPredictionInfoProducerName`` (default ``predicted-latency-producer``),
  ``prefixMatchInfoProducerName`` (default ``approx-prefix-cache-producer``).

YAML::

    plugins:
      - type: latency-scorer
        parameters: {ttftWeight: 0.8, tpotWeight: 0.2, headroomSelectionStrategy: least}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: latency-scorer
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from epp.plugin import (
    PREFIX_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    ScorerCategory,
)
from epp.plugin.latency import (
    LATENCY_PREDICTION_INFO,
    PREDICTED_LATENCY_PRODUCER,
    LatencyPredictionInfo,
    prefix_score,
)

W_MAX: Final = 100
EPS: Final = 1e-9
_NONE: Final = LatencyPredictionInfo(True, True, 0.0, 0.0, 0.0, 0.0, 0)
"""What an endpoint without a prediction counts as (upstream's zero headroom)."""


class LatencyScorer(PluginBase):
    TYPE: ClassVar[str] = "latency-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.BALANCE

    @dataclass(frozen=True)
    class Params:
        ttft_weight: float = 0.8
        tpot_weight: float = 0.2
        headroom_selection_strategy: Literal["least", "most"] = "least"
        composite_kv_weight: float = field(default=1.0, metadata={"yaml": "compositeKVWeight"})
        composite_queue_weight: float = 1.0
        composite_prefix_weight: float = 1.0
        latency_prediction_info_producer_name: str = ""
        prefix_match_info_producer_name: str = ""

        def __post_init__(self) -> None:
            for name in (
                "ttft_weight",
                "tpot_weight",
                "composite_kv_weight",
                "composite_queue_weight",
                "composite_prefix_weight",
            ):
                if getattr(self, name) < 0:
                    raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self._key = LATENCY_PREDICTION_INFO.key(
            p.latency_prediction_info_producer_name or PREDICTED_LATENCY_PRODUCER
        )
        self._prefix_key = PREFIX_MATCH_INFO.key(
            p.prefix_match_info_producer_name or "approx-prefix-cache-producer"
        )

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key, self._prefix_key})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        infos: Mapping[str, LatencyPredictionInfo] | None = request.attributes.get(self._key)
        if not infos or not any(e.id in infos for e in endpoints):
            return self._composite(request, endpoints)
        data = [(e, infos.get(e.id, _NONE)) for e in endpoints]
        scores = dict.fromkeys((e.id for e in endpoints), 0.0)
        positive = [d for d in data if d[1].ttft_headroom >= 0 and d[1].tpot_headroom >= 0]
        if positive:
            self._score_group(positive, scores, force_least=False)
            return scores
        idle = [d for d in data if d[1].dispatched_request_count == 0]
        if idle:
            self._score_group(idle, scores, force_least=True)
            return scores
        tpot_only = [d for d in data if d[1].ttft_headroom >= 0]
        ttft_only = [d for d in data if d[1].tpot_headroom >= 0]
        group = tpot_only or ttft_only or data
        self._score_group(group, scores, force_least=True)
        return scores

    def _score_group(
        self,
        group: Sequence[tuple[Endpoint, LatencyPredictionInfo]],
        scores: dict[str, float],
        *,
        force_least: bool,
    ) -> None:
        ttft = [abs(info.ttft_headroom) for _, info in group]
        tpot = [abs(info.tpot_headroom) for _, info in group]
        t_min, t_range = min(ttft), max(ttft) - min(ttft)
        p_min, p_range = min(tpot), max(tpot) - min(tpot)
        a, b = _normalized(self.params.ttft_weight, self.params.tpot_weight)
        if t_range <= EPS < p_range:
            a, b = 0.0, 1.0
        elif p_range <= EPS < t_range:
            a, b = 1.0, 0.0
        most = not force_least and self.params.headroom_selection_strategy == "most"
        for (endpoint, _), h_ttft, h_tpot in zip(group, ttft, tpot, strict=True):
            n_ttft = (h_ttft - t_min) / t_range if t_range > EPS else 0.5
            n_tpot = (h_tpot - p_min) / p_range if p_range > EPS else 0.5
            combined = a * n_ttft + b * n_tpot
            level = combined if most else 1.0 - combined
            scores[endpoint.id] = min(1.0, (math.floor(level * W_MAX) + 1) / W_MAX)

    def _composite(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> dict[str, float]:
        p = self.params
        wkv, wq, wp = p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
        total = wkv + wq + wp
        if total <= 0:
            wkv, wq, wp, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wp = wkv / total, wq / total, wp / total
        queues = [e.metrics.waiting_queue_size if e.metrics else 0 for e in endpoints]
        max_q = max(queues, default=0)
        prefix: Mapping[str, PrefixMatchInfo] | None = request.attributes.get(self._prefix_key)
        scores = {}
        for endpoint, q in zip(endpoints, queues, strict=True):
            kv = endpoint.metrics.kv_cache_usage_percent if endpoint.metrics else 0.0
            rel_queue = (max_q - q) / max_q if max_q > 0 else 1.0
            composite = wkv * (1.0 - kv) + wq * rel_queue + wp * prefix_score(prefix, endpoint.id)
            scores[endpoint.id] = math.floor(W_MAX * composite + 0.5) / W_MAX  # Go's Round
        return scores


def _normalized(a: float, b: float) -> tuple[float, float]:
    total = a + b
    if total <= 0:
        return 1.0, 0.0
    return a / total, b / total
