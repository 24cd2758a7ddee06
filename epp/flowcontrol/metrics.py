"""Prometheus families of the flow controller (spec §9), on the App's registry.

Canonical names are ``llm_d_epp_flow_control_*``; the six families upstream still dual-emits
also get their deprecated ``inference_extension_flow_control_*`` twin. Labels from client-chosen
strings are bounded as on the request metrics (``epp.observability.labels``): the ``fairness_id``
label keeps its first 64 values of at most 128 characters (later or longer ones read ``other``),
and ``model_name`` / ``target_model_name`` go through the App's model-label policy (a name the
pool does not serve reads ``unknown``; without one, as in unit tests, a cap of 1000 values).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.observability.labels import FAIRNESS_LABEL_CAP, MAX_FAIRNESS_CHARS
from epp.observability.metrics import LabelCap, MetricSpec, build_families

if TYPE_CHECKING:
    from epp.flowcontrol.config import FlowControlConfig
    from epp.flowcontrol.queues import Band
    from epp.plugin.flow import QueuedRequest

ModelLabelPolicy = Callable[[str, str], tuple[str, str]]
"""(incoming model, target model) -> their label values (``EppMetrics.models``)."""

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
_BAND_LABELS: Final = ("priority", "inference_pool")
_POOL_LABELS: Final = ("inference_pool",)


class _Pair:
    """A canonical family and, when upstream still emits one, its deprecated twin."""

    def __init__(self, *families: Any) -> None:
        self._families = families

    def labels(self, *values: str) -> list[Any]:
        return [f.labels(*values) if values else f for f in self._families]


# Registration order is exposition order; keep it. Upstream names, help and labels verbatim
# (tests/unit/observability/test_metric_tables.py holds the golden list).
FLOW_CONTROL_METRICS: Final = (
    MetricSpec(
        "queue_duration",
        Histogram,
        "llm_d_epp_flow_control_request_queue_duration_seconds",
        "Time requests spend in flow control, from enqueue to outcome",
        _QUEUE_DURATION_LABELS,
        buckets=_QUEUE_BUCKETS,
        twin="inference_extension_flow_control_request_queue_duration_seconds",
    ),
    MetricSpec(
        "dispatch_cycle",
        Histogram,
        "llm_d_epp_flow_control_dispatch_cycle_duration_seconds",
        "Duration of one flow-control dispatch cycle",
        (),
        buckets=_CYCLE_BUCKETS,
        twin="inference_extension_flow_control_dispatch_cycle_duration_seconds",
    ),
    MetricSpec(
        "enqueue_duration",
        Histogram,
        "llm_d_epp_flow_control_request_enqueue_duration_seconds",
        "Time taken to enqueue a request into flow control",
        ("fairness_id", "priority", "outcome"),
        buckets=_CYCLE_BUCKETS,
        twin="inference_extension_flow_control_request_enqueue_duration_seconds",
    ),
    MetricSpec(
        "queue_size",
        Gauge,
        "llm_d_epp_flow_control_queue_size",
        "Requests held in flow-control queues",
        _QUEUE_LABELS,
        twin="inference_extension_flow_control_queue_size",
    ),
    MetricSpec(
        "queue_bytes",
        Gauge,
        "llm_d_epp_flow_control_queue_bytes",
        "Bytes of requests held in flow-control queues",
        _QUEUE_LABELS,
        twin="inference_extension_flow_control_queue_bytes",
    ),
    MetricSpec(
        "pool_saturation",
        Gauge,
        "llm_d_epp_flow_control_pool_saturation",
        "Pool saturation gating dispatch (stage prefill, decode or effective)",
        ("inference_pool", "stage"),
        twin="inference_extension_flow_control_pool_saturation",
    ),
    MetricSpec(
        "stale_endpoints",
        Gauge,
        "llm_d_epp_flow_control_stale_endpoints",
        "Candidate endpoints with missing or stale metrics at the last saturation reading",
        ("detector",),
    ),
    MetricSpec(
        "capacity_requests",
        Gauge,
        "llm_d_epp_flow_control_capacity_utilization_requests",
        "Fraction of a band's request capacity in use",
        _BAND_LABELS,
    ),
    MetricSpec(
        "capacity_bytes",
        Gauge,
        "llm_d_epp_flow_control_capacity_utilization_bytes",
        "Fraction of a band's byte capacity in use",
        _BAND_LABELS,
    ),
    MetricSpec(
        "global_requests",
        Gauge,
        "llm_d_epp_flow_control_global_capacity_utilization_requests",
        "Fraction of the global request capacity in use (only when one is set)",
        _POOL_LABELS,
    ),
    MetricSpec(
        "global_bytes",
        Gauge,
        "llm_d_epp_flow_control_global_capacity_utilization_bytes",
        "Fraction of the global byte capacity in use (only when one is set)",
        _POOL_LABELS,
    ),
    MetricSpec(
        "requests_total",
        Counter,
        "llm_d_epp_flow_control_requests_total",
        "Requests processed by flow control, by outcome",
        ("outcome", "priority", "inference_pool"),
    ),
    MetricSpec(
        "revocations_issued",
        Counter,
        "llm_d_epp_flow_control_revocations_issued_total",
        "In-flight evictions issued, by the demand band's priority",
        _BAND_LABELS,
    ),
    MetricSpec(
        "revocations",
        Counter,
        "llm_d_epp_flow_control_revocations_total",
        "In-flight evictions by terminal outcome (confirmed, timed_out)",
        ("outcome", "inference_pool"),
    ),
    MetricSpec(
        "reclaim_target",
        Gauge,
        "llm_d_epp_flow_control_reclaim_target",
        "Last computed reclamation deficit (saturation units)",
        _POOL_LABELS,
    ),
    MetricSpec(
        "pending_reclaim",
        Gauge,
        "llm_d_epp_flow_control_pending_reclaim",
        "Outstanding and cooling reclaim debits (saturation units)",
        _POOL_LABELS,
    ),
    MetricSpec(
        "confirmation",
        Histogram,
        "llm_d_epp_flow_control_revocation_confirmation_seconds",
        "Time from eviction to the end of the evicted request's stream",
        _POOL_LABELS,
        _CONFIRM_BUCKETS,
    ),
    # Ours: the view across EPP replicas (epp.flowcontrol.shared).
    MetricSpec(
        "cross_replica_queue_size",
        Gauge,
        "llm_d_epp_flow_control_cross_replica_queue_size",
        "Requests queued in flow control across EPP replicas (this one plus its peers as last "
        "reported), by band",
        _BAND_LABELS,
    ),
    MetricSpec(
        "cross_replica_peers",
        Gauge,
        "llm_d_epp_flow_control_cross_replica_peers",
        "Other EPP replicas whose flow-control occupancy this replica holds",
        _POOL_LABELS,
    ),
)


class FlowControlMetrics:
    """Every flow-control family, one attribute per ``FLOW_CONTROL_METRICS`` row (a ``_Pair`` when
    the row has a deprecated twin), plus the recording helpers of one controller: it keeps the
    queue labels of that controller's queued requests (by ``seq``) between enqueue and outcome."""

    pool: str
    fairness_cap: LabelCap
    model_cap: LabelCap
    queue_duration: _Pair
    dispatch_cycle: _Pair
    enqueue_duration: _Pair
    queue_size: _Pair
    queue_bytes: _Pair
    pool_saturation: _Pair
    stale_endpoints: Gauge
    capacity_requests: Gauge
    capacity_bytes: Gauge
    global_requests: Gauge
    global_bytes: Gauge
    requests_total: Counter
    revocations_issued: Counter
    revocations: Counter
    reclaim_target: Gauge
    pending_reclaim: Gauge
    confirmation: Histogram
    cross_replica_queue_size: Gauge
    cross_replica_peers: Gauge

    def __init__(
        self, registry: CollectorRegistry, pool: str, model_labels: ModelLabelPolicy | None = None
    ) -> None:
        self.pool = pool
        self.fairness_cap = LabelCap(FAIRNESS_LABEL_CAP, max_chars=MAX_FAIRNESS_CHARS)
        self.model_cap = LabelCap()
        self._model_labels = model_labels or (lambda m, t: (self.model_cap(m), self.model_cap(t)))
        self._labels: dict[int, tuple[str, ...]] = {}  # queue labels by item seq, while queued
        for spec in FLOW_CONTROL_METRICS:
            families = build_families(spec, registry)
            setattr(self, spec.attr, _Pair(*families) if spec.twin else families[0])

    def queue_labels(self, item: QueuedRequest) -> tuple[str, ...]:
        """The ``queue_size`` / ``queue_bytes`` labels of ``item``, label caps applied."""
        model, target = self._model_labels(item.request.incoming_model, item.request.target_model)
        return (self.fairness_cap(item.fairness_id), str(item.priority), self.pool, model, target)

    def observe_enqueue(self, item: QueuedRequest, outcome: str, seconds: float) -> None:
        labels = (self.fairness_cap(item.fairness_id), str(item.priority), outcome)
        for child in self.enqueue_duration.labels(*labels):
            child.observe(seconds)

    def enter_queue(self, item: QueuedRequest, labels: tuple[str, ...]) -> None:
        """``item`` now waits in a queue; its ``labels`` are kept until ``finished``."""
        self._labels[item.seq] = labels
        for child in self.queue_size.labels(*labels):
            child.inc()
        for child in self.queue_bytes.labels(*labels):
            child.inc(item.size_bytes)

    def leave_queue(self, item: QueuedRequest) -> None:
        labels = self._labels.get(item.seq)
        if labels is None:
            return
        for child in self.queue_size.labels(*labels):
            child.dec()
        for child in self.queue_bytes.labels(*labels):
            child.dec(item.size_bytes)

    def finished(
        self, item: QueuedRequest, now: float, labels: tuple[str, ...] | None = None
    ) -> None:
        """``item`` left flow control with ``item.outcome``. ``labels``: those of an item that
        never queued; by default the ones kept by ``enter_queue`` (none: no duration sample)."""
        if labels is None:
            labels = self._labels.pop(item.seq, ())
        if labels:
            fairness, priority, pool, model, target = labels
            for child in self.queue_duration.labels(
                fairness, priority, item.outcome, pool, model, target
            ):
                child.observe(max(0.0, now - item.enqueue_time))
        self.count(item.outcome, item.priority)

    def count(self, outcome: str, priority: int) -> None:
        self.requests_total.labels(outcome, str(priority), self.pool).inc()

    def observe_cycle(self, seconds: float) -> None:
        for child in self.dispatch_cycle.labels():
            child.observe(seconds)

    def record_capacity(
        self, bands: Mapping[int, Band], config: FlowControlConfig, queued: int, queued_bytes: int
    ) -> None:
        """Occupancy / capacity per band and, when ``config`` sets a global cap, overall."""
        for band in bands.values():
            labels = (str(band.priority), self.pool)
            limits = band.config
            if limits.max_requests:
                self.capacity_requests.labels(*labels).set(band.live / limits.max_requests)
            if limits.max_bytes:
                self.capacity_bytes.labels(*labels).set(band.bytes / limits.max_bytes)
        if config.max_requests:
            self.global_requests.labels(self.pool).set(queued / config.max_requests)
        if config.max_bytes:
            self.global_bytes.labels(self.pool).set(queued_bytes / config.max_bytes)

    def record_cross_replica(
        self, queued: Mapping[int, int], gone: Iterable[int], peers: int
    ) -> None:
        """Requests queued across replicas by band priority; ``gone``: bands no longer known."""
        for priority, count in queued.items():
            self.cross_replica_queue_size.labels(str(priority), self.pool).set(count)
        for priority in gone:
            with contextlib.suppress(KeyError):
                self.cross_replica_queue_size.remove(str(priority), self.pool)
        self.cross_replica_peers.labels(self.pool).set(peers)

    def forget_band(self, priority: int) -> None:
        for gauge in (self.capacity_requests, self.capacity_bytes):
            with contextlib.suppress(KeyError):
                gauge.remove(str(priority), self.pool)
