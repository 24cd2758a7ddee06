"""Reading pool saturation for the dispatch loop, per pipeline stage, with its gauges.

Endpoints are split by their ``llm-d.ai/role`` label as upstream does: ``prefill`` and
``encode-prefill`` serve the prefill stage; ``decode`` and unlabeled endpoints the decode stage;
``prefill-decode``, ``both`` and ``encode-prefill-decode`` serve both; ``encode`` and unknown
roles get no prefill or decode traffic and count nowhere. The saturation that gates dispatch
(stage ``effective``) is the larger of the two stage readings; with neither stage populated it is
the detector's reading over all the endpoints (1.0 for none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Final

from epp.flowcontrol.metrics import FlowControlMetrics
from epp.plugin import Endpoint, SaturationDetector

ROLE_LABEL: Final = "llm-d.ai/role"
_PREFILL_ROLES: Final = frozenset({"prefill", "encode-prefill"})
_DECODE_ROLES: Final = frozenset({"decode", ""})
_BOTH_ROLES: Final = frozenset({"prefill-decode", "both", "encode-prefill-decode"})


def stage_partitions(endpoints: Sequence[Endpoint]) -> tuple[list[Endpoint], list[Endpoint]]:
    """(prefill, decode) endpoints; interleaved ones are in both."""
    prefill: list[Endpoint] = []
    decode: list[Endpoint] = []
    for ep in endpoints:
        role = ep.labels.get(ROLE_LABEL, "")
        if role in _PREFILL_ROLES or role in _BOTH_ROLES:
            prefill.append(ep)
        if role in _DECODE_ROLES or role in _BOTH_ROLES:
            decode.append(ep)
    return prefill, decode


class SaturationReader:
    def __init__(self, detector: SaturationDetector, metrics: FlowControlMetrics) -> None:
        self.detector = detector
        self._metrics = metrics

    def read(self, endpoints: Sequence[Endpoint], now: float) -> float:
        m = self._metrics
        saturation = -1.0
        for stage, part in zip(("prefill", "decode"), stage_partitions(endpoints), strict=True):
            if not part:
                for family in m.pool_saturation.labels():
                    with contextlib.suppress(KeyError):
                        family.remove(m.pool, stage)
                continue
            value = self.detector.saturation(now, part)
            for child in m.pool_saturation.labels(m.pool, stage):
                child.set(value)
            saturation = max(saturation, value)
        if saturation < 0:
            saturation = self.detector.saturation(now, endpoints)
        for child in m.pool_saturation.labels(m.pool, "effective"):
            child.set(saturation)
        stale = stale_count(self.detector, now, endpoints)
        if stale is not None:
            m.stale_endpoints.labels(self.detector.typed_name.type).set(stale)
        return saturation


def stale_count(
    detector: SaturationDetector, now: float, endpoints: Sequence[Endpoint]
) -> int | None:
    """Endpoints the detector scores as stale: its own ``stale_endpoints(now, endpoints)`` when it
    has one, else those past its ``params.staleness_seconds``; None for detectors without."""
    counter = getattr(detector, "stale_endpoints", None)
    if callable(counter):
        return int(counter(now, endpoints))
    staleness = getattr(getattr(detector, "params", None), "staleness_seconds", None)
    if staleness is None:
        return None
    return sum(
        1 for ep in endpoints if ep.metrics is None or now - ep.metrics.update_time > staleness
    )


def confirmation_grace(detector: SaturationDetector) -> float:
    """How long freed capacity takes to show in the saturation signal (upstream's derivation):
    10 ms for the concurrency detector (it counts at once), else one scrape tick (50 ms) + the
    staleness window + 250 ms for the engine to release the request's memory."""
    if detector.typed_name.type == "concurrency-detector":
        return 0.01
    staleness = getattr(getattr(detector, "params", None), "staleness_seconds", 0.2)
    return 0.05 + float(staleness) + 0.25
