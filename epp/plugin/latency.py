"""Data exchanged between latency-prediction plugins, and the SLO headers they read.

``predicted-latency-producer`` publishes, for every candidate endpoint it could predict,
``LatencyPredictionInfo/<name>`` (``LATENCY_PREDICTION_INFO.key(name)``): a
``Mapping[endpoint id, LatencyPredictionInfo]``. ``latency-scorer``, ``slo-headroom-tier-filter``,
``latency-slo-admitter`` and ``prefix-cache-affinity-filter`` (``ttftSource: latencyPredictor``)
read it. An endpoint missing from the mapping has no prediction; a request whose predictions all
failed (the sidecar down, its answer late) has no mapping at all, and the consumers fall back to
what they do without predictions.

Headroom is the request's SLO minus the prediction, in milliseconds: positive meets the SLO,
negative misses it. A request without an SLO header has an SLO of 0, so its headroom is the
negated prediction (always negative): consumers then prefer the lowest predicted latency. When
TPOT is not predicted (non-streaming mode, a prefill endpoint of disaggregated serving) the
producer publishes ``tpot_valid=True`` and ``tpot_headroom=0``, so TPOT weighs in nowhere.

The SLO headers (milliseconds, upstream's names; the second of each pair is the deprecated alias):
``x-llm-d-slo-ttft-ms`` / ``x-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms`` / ``x-slo-tpot-ms``.
``slo_ms`` reads one: absent, empty or not a number is 0 (no SLO), as upstream's parsing gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from epp.plugin.keys import DataType
from epp.plugin.prefix import PrefixMatchInfo


@dataclass(frozen=True, slots=True)
class LatencyPredictionInfo:
    """Predicted latency of one request on one endpoint (milliseconds) and its SLO headroom.

    ``dispatched_request_count`` is the number of this EPP's requests running on the endpoint
    (dispatched, not yet complete), which a consumer may trust more than a scrape."""

    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float
    tpot_headroom: float
    ttft: float
    tpot: float
    dispatched_request_count: int = 0

    @property
    def is_valid(self) -> bool:
        """Both predictions meet the request's SLOs."""
        return self.ttft_valid and self.tpot_valid


LATENCY_PREDICTION_INFO: Final[DataType[Mapping[str, LatencyPredictionInfo]]] = DataType(
    "LatencyPredictionInfo"
)
"""Data type of a ``Mapping[str, LatencyPredictionInfo]`` (endpoint id → prediction)."""

PREDICTED_LATENCY_PRODUCER: Final = "predicted-latency-producer"
"""Type (and default name) of the producer of ``LATENCY_PREDICTION_INFO``."""

SLO_TTFT_HEADERS: Final = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SLO_TPOT_HEADERS: Final = ("x-llm-d-slo-tpot-ms", "x-slo-tpot-ms")


def slo_ms(headers: Mapping[str, str], names: tuple[str, ...]) -> float:
    """The SLO in the first present header of ``names`` (milliseconds); 0 when it is absent or
    not a finite number."""
    for name in names:
        value = headers.get(name)
        if value is None:
            continue
        try:
            parsed = float(value)
        except ValueError:
            return 0.0
        return parsed if math.isfinite(parsed) else 0.0
    return 0.0


def prefix_score(infos: Mapping[str, PrefixMatchInfo] | None, endpoint_id: str) -> float:
    """The share of the prompt's blocks ``endpoint_id`` caches (``match / total``); 0 without
    match info or blocks."""
    if infos is None:
        return 0.0
    info = infos.get(endpoint_id)
    if info is None or info.total_blocks <= 0:
        return 0.0
    return min(1.0, max(0.0, info.match_blocks / info.total_blocks))
