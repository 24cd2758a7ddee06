"""Prometheus families of the flow controller (spec §9), on the App's registry.

Canonical names are ``llm_d_epp_flow_control_*``; the six families upstream still dual-emits
also get their deprecated ``inference_extension_flow_control_*`` twin. The ``fairness_id`` label
keeps at most 1000 distinct values and the model labels 1000 (shared by ``model_name`` and
``target_model_name``); later values read ``other``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.observability.metrics import LabelCap

if TYPE_CHECKING:
    from epp.flowcontrol.queues import BandConfig

FAIRNESS_LABEL_CAP: Final = 1000

_QUEUE_BUCKETS: Final = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
_CYCLE_BUCKETS: Final = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_CONFIRM_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

_QUEUE_LABELS: Final = (
    "fairness_id",
    "priority",
    "inference_pool",
    "model_name",
    "target_model_name",
)
_QUEUE_DURATION_LABELS: Final = (
    "fairness_id",
    "priority",
    "outcome",
    "inference_pool",
    "model_name",
    "target_model_name",
)


class _Pair:
    """A canonical family and, when upstream still emits one, its deprecated twin."""

    def __init__(self, *families: Any) -> None:
        self._families = families

    def labels(self, *values: str) -> list[Any]:
        return [f.labels(*values) if values else f for f in self._families]


class FlowControlMetrics:
    def __init__(self, registry: CollectorRegistry, pool: str) -> None:
        self.pool = pool
        self.fairness_cap = LabelCap(FAIRNESS_LABEL_CAP)
        self.model_cap = LabelCap()
        r = registry
        self.queue_duration = self._pair(
            Histogram,
            "request_queue_duration_seconds",
            "Time requests spend in flow control, from enqueue to outcome",
            _QUEUE_DURATION_LABELS,
            r,
            buckets=_QUEUE_BUCKETS,
        )
        self.dispatch_cycle = self._pair(
            Histogram,
            "dispatch_cycle_duration_seconds",
            "Duration of one flow-control dispatch cycle",
            (),
            r,
            buckets=_CYCLE_BUCKETS,
        )
        self.enqueue_duration = self._pair(
            Histogram,
            "request_enqueue_duration_seconds",
            "Time taken to enqueue a request into flow control",
            ("fairness_id", "priority", "outcome"),
            r,
            buckets=_CYCLE_BUCKETS,
        )
        self.queue_size = self._pair(
            Gauge, "queue_size", "Requests held in flow-control queues", _QUEUE_LABELS, r
        )
        self.queue_bytes = self._pair(
            Gauge, "queue_bytes", "Bytes of requests held in flow-control queues", _QUEUE_LABELS, r
        )
        self.pool_saturation = self._pair(
            Gauge,
            "pool_saturation",
            "Pool saturation gating dispatch (stage prefill, decode or effective)",
            ("inference_pool", "stage"),
            r,
        )
        fc = "llm_d_epp_flow_control_"
        self.stale_endpoints = Gauge(
            fc + "stale_endpoints",
            "Candidate endpoints with missing or stale metrics at the last saturation reading",
            ("detector",),
            registry=r,
        )
        band = ("priority", "inference_pool")
        self.capacity_requests = Gauge(
            fc + "capacity_utilization_requests",
            "Fraction of a band's request capacity in use",
            band,
            registry=r,
        )
        self.capacity_bytes = Gauge(
            fc + "capacity_utilization_bytes",
            "Fraction of a band's byte capacity in use",
            band,
            registry=r,
        )
        self.global_requests = Gauge(
            fc + "global_capacity_utilization_requests",
            "Fraction of the global request capacity in use (only when one is set)",
            ("inference_pool",),
            registry=r,
        )
        self.global_bytes = Gauge(
            fc + "global_capacity_utilization_bytes",
            "Fraction of the global byte capacity in use (only when one is set)",
            ("inference_pool",),
            registry=r,
        )
        self.requests_total = Counter(
            fc + "requests_total",
            "Requests processed by flow control, by outcome",
            ("outcome", "priority", "inference_pool"),
            registry=r,
        )
        self.revocations_issued = Counter(
            fc + "revocations_issued_total",
            "In-flight evictions issued, by the demand band's priority",
            band,
            registry=r,
        )
        self.revocations = Counter(
            fc + "revocations_total",
            "In-flight evictions by terminal outcome (confirmed, timed_out)",
            ("outcome", "inference_pool"),
            registry=r,
        )
        self.reclaim_target = Gauge(
            fc + "reclaim_target",
            "Last computed reclamation deficit (saturation units)",
            ("inference_pool",),
            registry=r,
        )
        self.pending_reclaim = Gauge(
            fc + "pending_reclaim",
            "Outstanding and cooling reclaim debits (saturation units)",
            ("inference_pool",),
            registry=r,
        )
        self.confirmation = Histogram(
            fc + "revocation_confirmation_seconds",
            "Time from eviction to the end of the evicted request's stream",
            ("inference_pool",),
            buckets=_CONFIRM_BUCKETS,
            registry=r,
        )

    @staticmethod
    def _pair(
        kind: Any,
        name: str,
        doc: str,
        labels: Sequence[str],
        registry: CollectorRegistry,
        **kw: Any,
    ) -> _Pair:
        canonical = kind(f"llm_d_epp_flow_control_{name}", doc, labels, registry=registry, **kw)
        twin = kind(
            f"inference_extension_flow_control_{name}",
            f"Deprecated: llm_d_epp_flow_control_{name}",
            labels,
            registry=registry,
            **kw,
        )
        return _Pair(canonical, twin)

    def queue_labels(
        self, fairness_id: str, priority: int, model: str, target: str
    ) -> tuple[str, ...]:
        return (
            self.fairness_cap(fairness_id),
            str(priority),
            self.pool,
            self.model_cap(model),
            self.model_cap(target),
        )

    def observe_enqueue(
        self, fairness_id: str, priority: int, outcome: str, seconds: float
    ) -> None:
        labels = (self.fairness_cap(fairness_id), str(priority), outcome)
        for child in self.enqueue_duration.labels(*labels):
            child.observe(seconds)

    def record_capacity(
        self,
        bands: Iterable[tuple[int, int, int, BandConfig]],
        global_requests: tuple[int, int],
        global_bytes: tuple[int, int],
    ) -> None:
        """Occupancy / capacity per band (priority, requests, bytes, limits) and, when a global
        cap is set, overall; ``global_*`` are (in use, cap) pairs, cap 0 = none."""
        for priority, live, size, limits in bands:
            labels = (str(priority), self.pool)
            if limits.max_requests:
                self.capacity_requests.labels(*labels).set(live / limits.max_requests)
            if limits.max_bytes:
                self.capacity_bytes.labels(*labels).set(size / limits.max_bytes)
        used, cap = global_requests
        if cap:
            self.global_requests.labels(self.pool).set(used / cap)
        used, cap = global_bytes
        if cap:
            self.global_bytes.labels(self.pool).set(used / cap)

    def forget_band(self, priority: int) -> None:
        for gauge in (self.capacity_requests, self.capacity_bytes):
            with contextlib.suppress(KeyError):
                gauge.remove(str(priority), self.pool)
