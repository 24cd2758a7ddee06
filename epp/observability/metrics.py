"""Prometheus metrics of one EPP (one ``CollectorRegistry`` per App).

Names follow upstream (spec §9): canonical ``llm_d_epp_*`` families, plus the deprecated twins
(``inference_objective_*``, ``inference_pool_*``, ``inference_extension_*``) so existing dashboards
keep working. Model-name labels follow ``epp.observability.labels.ModelLabels``: a name the pool
does not serve reads ``unknown``, so clients cannot grow the series count by choosing names.
``llm_d_epp_extproc_protocol_errors_total{reason}`` is ours (no upstream twin): ext_proc streams
ended with INVALID_ARGUMENT for protocol misuse (``epp.server.stream``).

The families of plugin types upstream dashboards key on even when unconfigured (predicted latency,
DisaggregatedSet rollouts) are declared here too, after the table, and recorded by those plugins
through the typed recorders of ``epp.plugin.recorders``.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.observability.families import (  # bucket bounds, and the table machinery
    _ITL_BUCKETS,
    _LATENCY_BUCKETS,
    _NTPOT_BUCKETS,
    _PLUGIN_BUCKETS,
    _REQUEST_PROCESSING_BUCKETS,
    _RESPONSE_PROCESSING_BUCKETS,
    _SCHED_BUCKETS,
    _SIZE_BUCKETS,
    _TOKEN_BUCKETS,
    _TPOT_BUCKETS,
    EppRegistry,
    MetricSpec,
    _Twin,
    build_families,
    build_info,
)
from epp.observability.labels import (
    FAIRNESS_LABEL_CAP,
    MODEL_LABEL_CAP,
    OTHER,
    UNKNOWN,
    LabelCap,
    ModelLabels,
)
from epp.plugin.recorders import DisaggregatedSetMetrics, PredictedLatencyMetrics

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

MODEL_LABELS: Final = ("model_name", "target_model_name")
_FAIRNESS_LABELS: Final = (*MODEL_LABELS, "fairness_id", "priority")
_POOL_LABELS: Final = ("name",)
_PLUGIN_LABELS: Final = ("extension_point", "plugin_type", "plugin_name")
_REWRITE_LABELS: Final = ("model_rewrite_name", "model_name", "target_model")

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
        "streaming_tpot",
        Histogram,
        "llm_d_epp_request_streaming_tpot_seconds",
        "Average time per output token of a streamed response: (e2e - TTFT) / (output tokens - 1)",
        _FAIRNESS_LABELS,
        _TPOT_BUCKETS,
    ),
    MetricSpec(
        "streaming_itl",
        Histogram,
        "llm_d_epp_request_streaming_itl_seconds",
        "Time between consecutive response body chunks of a streamed response",
        _FAIRNESS_LABELS,
        _ITL_BUCKETS,
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
        twin="inference_extension_scheduler_attempts_total",
        twin_labels=("status", "target_model_name", "pod_name", "namespace", "port"),
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
        "scope_violations",
        Counter,
        "llm_d_epp_plugin_data_scope_violations_total",
        "Endpoint attribute accesses rejected because the plugin did not declare the data key "
        "(this EPP does not restrict access, so nothing is counted)",
        (*_PLUGIN_LABELS, "access"),
    ),
    MetricSpec(
        "request_processing",
        Histogram,
        "llm_d_epp_request_processing_duration_seconds",
        "EPP request processing latency, from request headers until the request body has been "
        "handled, admission control included",
        buckets=_REQUEST_PROCESSING_BUCKETS,
    ),
    MetricSpec(
        "response_processing",
        Histogram,
        "llm_d_epp_response_processing_duration_seconds",
        "EPP response processing latency: the sum of per-message handling time of a streamed "
        "response, or response headers to completion for a non-streamed one",
        buckets=_RESPONSE_PROCESSING_BUCKETS,
    ),
    MetricSpec(
        "poll_errors",
        Counter,
        "llm_d_epp_datalayer_poll_errors_total",
        "Data-source polls that failed",
        ("source_type",),
        twin="llm_d_inference_scheduler_datalayer_poll_errors_total",
    ),
    MetricSpec(
        "extract_errors",
        Counter,
        "llm_d_epp_datalayer_extract_errors_total",
        "Extractions that failed",
        ("source_type", "extractor_type"),
        twin="llm_d_inference_scheduler_datalayer_extract_errors_total",
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
        "std_kv",
        Gauge,
        "llm_d_epp_std_dev_kv_cache_utilization",
        "Standard deviation of KV-cache utilisation over the pool",
        _POOL_LABELS,
    ),
    MetricSpec(
        "std_queue",
        Gauge,
        "llm_d_epp_std_dev_queue_size",
        "Standard deviation of waiting-queue length over the pool",
        _POOL_LABELS,
    ),
    MetricSpec(
        "std_running",
        Gauge,
        "llm_d_epp_std_dev_running_requests",
        "Standard deviation of running requests over the pool",
        _POOL_LABELS,
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
    MetricSpec(
        "info",
        Gauge,
        "llm_d_epp_info",
        "Build information",
        ("commit", "build_ref"),
        twin="inference_extension_info",
        twin_doc="General information of the current build of Inference Extension.",
    ),
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
    streaming_tpot: Histogram
    streaming_itl: Histogram
    ntpot: _Twin
    scheduler_e2e: _Twin
    scheduler_attempts: _Twin
    plugin_duration: _Twin
    plugin_errors: Counter
    scope_violations: Counter
    request_processing: Histogram
    response_processing: Histogram
    poll_errors: _Twin
    extract_errors: _Twin
    ready_endpoints: _Twin
    avg_kv: _Twin
    avg_queue: _Twin
    avg_running: _Twin
    std_kv: Gauge
    std_queue: Gauge
    std_running: Gauge
    per_endpoint_queue: _Twin
    info: _Twin
    model_rewrites: _Twin
    protocol_errors: Counter

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or EppRegistry()
        self.model_labels = ModelLabels()
        for spec in EPP_METRICS:
            families = build_families(spec, self.registry)
            setattr(self, spec.attr, _Twin(*families) if spec.twin else families[0])
        self.info.set(build_info(), build_info(), 1)
        # Fed by predicted-latency-producer (and the latency plugins) and by
        # disaggregatedset-rollout-screener when configured; exposed without samples otherwise.
        PredictedLatencyMetrics.declare(self.registry)
        DisaggregatedSetMetrics.declare(self.registry)

    def models(self, model: str, target: str) -> tuple[str, str]:
        """Label values of a request's model and target model (``ModelLabels`` policy)."""
        target_label = self.model_labels(target)
        if model == target:
            return target_label, target_label
        return self.model_labels.alias(model), target_label
