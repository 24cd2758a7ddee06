"""``latency-slo-admitter``: reject a sheddable request that no endpoint is predicted to serve
within its SLOs.

Admitted at once: requests with priority >= 0, requests without an SLO header
(``x-llm-d-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms`` both absent or 0, with their ``x-slo-*``
aliases), and requests without predictions (``LatencyPredictionInfo/<producer>`` absent: the
predictor failed or is still learning). A sheddable request (priority < 0) with an SLO and
predictions is admitted when any candidate is

- *valid*: predicted to meet both SLOs (``LatencyPredictionInfo.is_valid``; TPOT always counts as
  met where the producer does not predict it);
- *idle*: its scrape shows no running request (or it has no metrics yet);
- *cold*: its KV cache is under 2% used (predictions for an empty server are unreliable);

and rejected otherwise: **429** ``ResourceExhausted`` with ``x-llm-d-request-dropped-reason:
rejected-saturated`` (upstream's director turns any admitter's denial into a 500; we keep the
status the rejection means, as ``probabilistic-admitter`` does).

Parameters (upstream's): ``latencyPredictionInfoProducerName`` (default
``predicted-latency-producer``).

YAML::

    plugins:
      - type: predicted-latency-producer
      - type: latency-slo-admitter
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    CycleState,
    DataKey,
    DropReason,
    Endpoint,
    ErrorCode,
    Handle,
    InferenceError,
    InferenceRequest,
    PluginBase,
)
from epp.plugin.latency import (
    LATENCY_PREDICTION_INFO,
    PREDICTED_LATENCY_PRODUCER,
    SLO_TPOT_HEADERS,
    SLO_TTFT_HEADERS,
    LatencyPredictionInfo,
    slo_ms,
)

COLD_KV: Final = 0.02
"""KV cache use under which an endpoint counts as cold."""


class LatencySLOAdmitter(PluginBase):
    TYPE: ClassVar[str] = "latency-slo-admitter"

    @dataclass(frozen=True)
    class Params:
        latency_prediction_info_producer_name: str = ""

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        producer = self.params.latency_prediction_info_producer_name or PREDICTED_LATENCY_PRODUCER
        self._key = LATENCY_PREDICTION_INFO.key(producer)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def admit(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> InferenceError | None:
        if request.priority >= 0:
            return None
        headers = request.headers
        if slo_ms(headers, SLO_TTFT_HEADERS) <= 0 and slo_ms(headers, SLO_TPOT_HEADERS) <= 0:
            return None
        infos: Mapping[str, LatencyPredictionInfo] | None = request.attributes.get(self._key)
        if not infos or not any(e.id in infos for e in endpoints):
            return None
        for endpoint in endpoints:
            m = endpoint.metrics
            if m is None or m.kv_cache_usage_percent < COLD_KV or m.running_requests_size == 0:
                return None  # cold or idle
            info = infos.get(endpoint.id)
            if info is not None and info.is_valid:
                return None
        return InferenceError(
            ErrorCode.RESOURCE_EXHAUSTED,
            "latency-slo-admitter: no endpoint is predicted to meet the request's SLOs",
            drop_reason=DropReason.SATURATED,
        )
