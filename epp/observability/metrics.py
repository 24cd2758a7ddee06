"""Prometheus metrics of one EPP (one ``CollectorRegistry`` per App).

Names follow upstream (spec §9): canonical ``llm_d_epp_*`` families, plus the deprecated twins
(``inference_objective_*``, ``inference_pool_*``, ``inference_extension_*``) so existing dashboards
keep working. Model-name labels follow ``epp.observability.labels.ModelLabels``: a name the pool
does not serve reads ``unknown``, so clients cannot grow the series count by choosing names.
``llm_d_epp_extproc_protocol_errors_total{reason}`` is ours (no upstream twin): ext_proc streams
ended with INVALID_ARGUMENT for protocol misuse (``epp.server.stream``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.observability.labels import (
    FAIRNESS_LABEL_CAP,
    MODEL_LABEL_CAP,
    OTHER,
    UNKNOWN,
    LabelCap,
    ModelLabels,
)

__all__ = [
    "EPP_METRICS",
    "FAIRNESS_LABEL_CAP",
    "MODEL_LABELS",
    "MODEL_LABEL_CAP",
    "OTHER",
    "UNKNOWN",
    "EppMetrics",
    "LabelCap",
    "MetricSpec",
    "ModelLabels",
    "build_families",
]

# Upstream's bucket bounds, verbatim (32778 included), packed densely rather than one a line.
# fmt: off
_LATENCY_BUCKETS: Final = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)
_SCHED_BUCKETS: Final = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_PLUGIN_BUCKETS: Final = (
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)
_TOKEN_BUCKETS: Final = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
    524288, 1048576,
)
_SIZE_BUCKETS: Final = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288,
    1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728,
)
# fmt: on
_NTPOT_BUCKETS: Final = (*_SCHED_BUCKETS, 0.2, 0.5, 1.0)

MODEL_LABELS: Final = ("model_name", "target_model_name")
_POOL_LABELS: Final = ("name",)
_PLUGIN_LABELS: Final = ("extension_point", "plugin_type", "plugin_name")
_REWRITE_LABELS: Final = ("model_rewrite_name", "model_name", "target_model")

Family = Counter | Gauge | Histogram


class MetricSpec(NamedTuple):
    """One row of a metric table: a family, plus its deprecated twin when upstream emits one.

    ``name`` is the exposed family name (counters spelled with ``_total``). The twin shares kind
    and buckets; its help defaults to ``Deprecated: <name>`` and its labels to ``labels``."""

    attr: str  # attribute of the metrics object that holds the family (or the pair)
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None  # histograms only
    twin: str | None = None
    twin_doc: str | None = None
    twin_labels: tuple[str, ...] | None = None


def build_families(spec: MetricSpec, registry: CollectorRegistry) -> list[Family]:
    """Register the row's family, then its twin if any (that order: the wrappers rely on it)."""
    kw: dict[str, Any] = {} if spec.buckets is None else {"buckets": spec.buckets}
    families: list[Family] = [spec.kind(spec.name, spec.doc, spec.labels, registry=registry, **kw)]
    if spec.twin is not None:
        doc = f"Deprecated: {spec.name}" if spec.twin_doc is None else spec.twin_doc
        labels = spec.labels if spec.twin_labels is None else spec.twin_labels
        families.append(spec.kind(spec.twin, doc, labels, registry=registry, **kw))
    return families


class _Twin:
    """One canonical family plus its deprecated twin; every call updates both."""

    def __init__(self, *metrics: Any) -> None:
        self._metrics = metrics

    @staticmethod
    def _child(metric: Any, labels: Sequence[str]) -> Any:
        return metric.labels(*labels) if labels else metric

    def inc(self, labels: Sequence[str], twin_labels: Sequence[str], amount: float = 1) -> None:
        self._child(self._metrics[0], labels).inc(amount)
        for m in self._metrics[1:]:
            self._child(m, twin_labels).inc(amount)

    def set(self, labels: Sequence[str], twin_labels: Sequence[str], value: float) -> None:
        self._child(self._metrics[0], labels).set(value)
        for m in self._metrics[1:]:
            self._child(m, twin_labels).set(value)

    def observe(self, labels: Sequence[str], twin_labels: Sequence[str], value: float) -> None:
        self._child(self._metrics[0], labels).observe(value)
        for m in self._metrics[1:]:
            self._child(m, twin_labels).observe(value)


# Registration order is exposition order; keep it. Upstream names, help and labels verbatim
# (tests/unit/observability/test_metric_tables.py holds the golden list).
EPP_METRICS: Final = (
    MetricSpec(
        "request_total",
        Counter,
        "llm_d_epp_request_total",
        "Requests handled",
        ("model_name", "target_model_name", "fairness_id", "priority"),
        twin="inference_objective_request_total",
        twin_labels=("model_name", "target_model_name", "priority"),
    ),
    MetricSpec(
        "request_errors",
        Counter,
        "llm_d_epp_request_error_total",
        "Requests that failed",
        (*MODEL_LABELS, "error_code"),
        twin="inference_objective_request_error_total",
    ),
    MetricSpec(
        "request_duration",
        Histogram,
        "llm_d_epp_request_duration_seconds",
        "End-to-end request latency seen by the EPP",
        MODEL_LABELS,
        _LATENCY_BUCKETS,
        twin="inference_objective_request_duration_seconds",
    ),
    MetricSpec(
        "request_size",
        Histogram,
        "llm_d_epp_request_size_bytes",
        "Request body size",
        MODEL_LABELS,
        _SIZE_BUCKETS,
        twin="inference_objective_request_sizes",
    ),
    MetricSpec(
        "response_size",
        Histogram,
        "llm_d_epp_response_size_bytes",
        "Response body size",
        MODEL_LABELS,
        _SIZE_BUCKETS,
        twin="inference_objective_response_sizes",
    ),
    MetricSpec(
        "input_tokens",
        Histogram,
        "llm_d_epp_request_input_tokens",
        "Prompt tokens",
        MODEL_LABELS,
        _TOKEN_BUCKETS,
        twin="inference_objective_input_tokens",
    ),
    MetricSpec(
        "output_tokens",
        Histogram,
        "llm_d_epp_request_output_tokens",
        "Completion tokens",
        MODEL_LABELS,
        _TOKEN_BUCKETS,
        twin="inference_objective_output_tokens",
    ),
    MetricSpec(
        "cached_tokens",
        Histogram,
        "llm_d_epp_request_cached_tokens",
        "Prompt tokens served from the prefix cache",
        MODEL_LABELS,
        _TOKEN_BUCKETS,
        twin="inference_objective_prompt_cached_tokens",
    ),
    MetricSpec(
        "running",
        Gauge,
        "llm_d_epp_request_running",
        "Requests in flight",
        MODEL_LABELS,
        twin="inference_objective_running_requests",
    ),
    MetricSpec(
        "ttft",
        Histogram,
        "llm_d_epp_request_ttft_seconds",
        "Time to first response byte",
        (*MODEL_LABELS, "streaming"),
        _LATENCY_BUCKETS,
    ),
    MetricSpec(
        "ntpot",
        Histogram,
        "llm_d_epp_request_ntpot_seconds",
        "Request latency divided by output tokens",
        MODEL_LABELS,
        _NTPOT_BUCKETS,
        twin="inference_objective_normalized_time_per_output_token_seconds",
    ),
    MetricSpec(
        "scheduler_e2e",
        Histogram,
        "llm_d_epp_scheduler_e2e_duration_seconds",
        "Scheduling latency",
        buckets=_SCHED_BUCKETS,
        twin="inference_extension_scheduler_e2e_duration_seconds",
    ),
    MetricSpec(
        "scheduler_attempts",
        Counter,
        "llm_d_epp_scheduler_attempts_total",
        "Scheduling attempts",
        ("status", "target_model_name", "endpoint_name", "namespace", "port"),
    ),
    MetricSpec(
        "plugin_duration",
        Histogram,
        "llm_d_epp_plugin_duration_seconds",
        "Plugin latency",
        _PLUGIN_LABELS,
        _PLUGIN_BUCKETS,
        twin="inference_extension_plugin_duration_seconds",
    ),
    MetricSpec(
        "plugin_errors",
        Counter,
        "llm_d_epp_plugin_errors_total",
        "Plugin calls that raised",
        _PLUGIN_LABELS,
    ),
    MetricSpec(
        "poll_errors",
        Counter,
        "llm_d_epp_datalayer_poll_errors_total",
        "Data-source polls that failed",
        ("source_type",),
    ),
    MetricSpec(
        "extract_errors",
        Counter,
        "llm_d_epp_datalayer_extract_errors_total",
        "Extractions that failed",
        ("source_type", "extractor_type"),
    ),
    MetricSpec(
        "ready_endpoints",
        Gauge,
        "llm_d_epp_ready_endpoints",
        "Endpoints with fresh metrics",
        _POOL_LABELS,
        twin="inference_pool_ready_pods",
    ),
    MetricSpec(
        "avg_kv",
        Gauge,
        "llm_d_epp_average_kv_cache_utilization",
        "Mean KV-cache utilisation over the pool",
        _POOL_LABELS,
        twin="inference_pool_average_kv_cache_utilization",
    ),
    MetricSpec(
        "avg_queue",
        Gauge,
        "llm_d_epp_average_queue_size",
        "Mean waiting-queue length over the pool",
        _POOL_LABELS,
        twin="inference_pool_average_queue_size",
    ),
    MetricSpec(
        "avg_running",
        Gauge,
        "llm_d_epp_average_running_requests",
        "Mean running requests over the pool",
        _POOL_LABELS,
        twin="inference_pool_average_running_requests",
    ),
    MetricSpec(
        "per_endpoint_queue",
        Gauge,
        "llm_d_epp_per_endpoint_queue_size",
        "Queue size per endpoint",
        ("name", "model_server_endpoint"),
        twin="inference_pool_per_pod_queue_size",
        twin_doc="Deprecated: per_endpoint_queue_size",  # sic: upstream's help lacks the prefix
        twin_labels=("name", "model_server_pod"),
    ),
    MetricSpec("info", Gauge, "llm_d_epp_info", "Build information", ("commit", "build_ref")),
    MetricSpec(
        "model_rewrites",
        Counter,
        "llm_d_epp_model_rewrite_decisions_total",
        "Requests whose model an InferenceModelRewrite rule rewrote",
        _REWRITE_LABELS,
        twin="inference_extension_model_rewrite_decisions_total",
    ),
    MetricSpec(
        "protocol_errors",
        Counter,
        "llm_d_epp_extproc_protocol_errors_total",
        "ext_proc streams ended with INVALID_ARGUMENT because the data plane broke the protocol",
        ("reason",),
    ),
)


class EppMetrics:
    """Every EPP family, one attribute per ``EPP_METRICS`` row: a ``_Twin`` when the row has a
    deprecated twin, else the bare family."""

    registry: CollectorRegistry
    model_labels: ModelLabels
    request_total: _Twin
    request_errors: _Twin
    request_duration: _Twin
    request_size: _Twin
    response_size: _Twin
    input_tokens: _Twin
    output_tokens: _Twin
    cached_tokens: _Twin
    running: _Twin
    ttft: Histogram
    ntpot: _Twin
    scheduler_e2e: _Twin
    scheduler_attempts: Counter
    plugin_duration: _Twin
    plugin_errors: Counter
    poll_errors: Counter
    extract_errors: Counter
    ready_endpoints: _Twin
    avg_kv: _Twin
    avg_queue: _Twin
    avg_running: _Twin
    per_endpoint_queue: _Twin
    info: Gauge
    model_rewrites: _Twin
    protocol_errors: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_labels = ModelLabels()
        for spec in EPP_METRICS:
            families = build_families(spec, self.registry)
            setattr(self, spec.attr, _Twin(*families) if spec.twin else families[0])

    def models(self, model: str, target: str) -> tuple[str, str]:
        """Label values of a request's model and target model (``ModelLabels`` policy)."""
        target_label = self.model_labels(target)
        if model == target:
            return target_label, target_label
        return self.model_labels.alias(model), target_label
