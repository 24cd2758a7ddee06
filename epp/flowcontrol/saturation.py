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
import logging
from collections.abc import Sequence

from epp.flowcontrol.metrics import FlowControlMetrics
from epp.plugin import (
    DEFAULT_CONFIRMATION_GRACE,
    ConfirmationGrace,
    Endpoint,
    SaturationDetector,
    StaleEndpointCounter,
)
from epp.plugin.flow import UsageLimitPolicy
from epp.plugin.roles import DECODE_ROLES, PREFILL_ROLES, role_of

log = logging.getLogger(__name__)


def stage_partitions(endpoints: Sequence[Endpoint]) -> tuple[list[Endpoint], list[Endpoint]]:
    """(prefill, decode) endpoints; interleaved ones are in both."""
    prefill: list[Endpoint] = []
    decode: list[Endpoint] = []
    for ep in endpoints:
        role = role_of(ep)
        if role in PREFILL_ROLES:
            prefill.append(ep)
        if role in DECODE_ROLES:
            decode.append(ep)
    return prefill, decode


class SaturationReader:
    def __init__(self, detector: SaturationDetector, metrics: FlowControlMetrics) -> None:
        self.detector = detector
        self._metrics = metrics
        self._stale = detector if isinstance(detector, StaleEndpointCounter) else None

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
        if self._stale is not None:
            stale = self._stale.stale_endpoints(now, endpoints)
            m.stale_endpoints.labels(self.detector.typed_name.type).set(stale)
        return saturation


def confirmation_grace(detector: SaturationDetector) -> float:
    """How long freed capacity takes to show in the detector's reading (its own
    ``confirmation_grace()``, else upstream's derivation for a scraped signal)."""
    if isinstance(detector, ConfirmationGrace):
        return detector.confirmation_grace()
    return DEFAULT_CONFIRMATION_GRACE


def band_ceilings(
    policy: UsageLimitPolicy, saturation: float, priorities: Sequence[int]
) -> list[float]:
    """The saturation below which each band (``priorities``, highest first) may dispatch; 1.0
    for a band the policy leaves out, and for every band when it fails (no gating this cycle)."""
    n = len(priorities)
    try:
        computed = list(policy.compute_limit(saturation, list(priorities)))
    except Exception:
        log.exception("flow control: usage-limit policy failed; not gating this cycle")
        computed = []
    return (computed + [1.0] * n)[:n]
