"""Golden list of every Prometheus family the EPP registers (name, type, help, labels, buckets).

Upstream dashboards key on these byte for byte, so the tables in ``epp.observability.metrics``
and ``epp.flowcontrol.metrics`` must reproduce them exactly. The literals below were generated
from the hand-written constructors the tables replaced; change them only together with upstream.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Final

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.flowcontrol import metrics as fc_metrics
from epp.flowcontrol.metrics import FlowControlMetrics
from epp.observability import metrics as epp_metrics
from epp.observability.metrics import EppMetrics

# type, help, label names in order, finite histogram bucket bounds (the +Inf bucket is implied).
Family = tuple[str, str, tuple[str, ...], tuple[float, ...]]

# Bucket bounds as prometheus_client stores them (floats), copied, not imported.
_LATENCY: Final = (
    0.005,
    0.025,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    1.25,
    1.5,
    2.0,
    3.0,
    4.0,
    5.0,
    6.0,
    8.0,
    10.0,
    15.0,
    20.0,
    30.0,
    45.0,
    60.0,
    120.0,
    180.0,
    240.0,
    300.0,
    360.0,
    480.0,
    600.0,
    900.0,
    1200.0,
    1800.0,
    2700.0,
    3600.0,
)
_SIZE: Final = (
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
    32768.0,
    65536.0,
    131072.0,
    262144.0,
    524288.0,
    1048576.0,
    2097152.0,
    4194304.0,
    8388608.0,
    16777216.0,
    33554432.0,
    67108864.0,
    134217728.0,
)
_TOKENS: Final = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
    32778.0,
    65536.0,
    131072.0,
    262144.0,
    524288.0,
    1048576.0,
)
_NTPOT: Final = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_SCHEDULER: Final = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
_PLUGIN: Final = (
    1e-05,
    2e-05,
    5e-05,
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
)
_QUEUE: Final = (
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
_PREDICTION: Final = (
    0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
_PREDICTED_TPOT: Final = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 4.5, 6.0, 12.0, 18.0, 24.0, 30.0, 36.0, 48.0, 60.0, 90.0, 120.0,
    180.0, 270.0, 360.0,
)  # fmt: skip
_CONFIRMATION: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

EPP_FAMILIES: Final[dict[str, Family]] = {
    "llm_d_epp_request_total": (
        "counter",
        "Requests handled",
        ("model_name", "target_model_name", "fairness_id", "priority"),
        (),
    ),
    "inference_objective_request_total": (
        "counter",
        "Deprecated: llm_d_epp_request_total",
        ("model_name", "target_model_name", "priority"),
        (),
    ),
    "llm_d_epp_request_error_total": (
        "counter",
        "Requests that failed",
        ("model_name", "target_model_name", "error_code"),
        (),
    ),
    "inference_objective_request_error_total": (
        "counter",
        "Deprecated: llm_d_epp_request_error_total",
        ("model_name", "target_model_name", "error_code"),
        (),
    ),
    "llm_d_epp_request_duration_seconds": (
        "histogram",
        "End-to-end request latency seen by the EPP",
        ("model_name", "target_model_name"),
        _LATENCY,
    ),
    "inference_objective_request_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_duration_seconds",
        ("model_name", "target_model_name"),
        _LATENCY,
    ),
    "llm_d_epp_request_size_bytes": (
        "histogram",
        "Request body size",
        ("model_name", "target_model_name"),
        _SIZE,
    ),
    "inference_objective_request_sizes": (
        "histogram",
        "Deprecated: llm_d_epp_request_size_bytes",
        ("model_name", "target_model_name"),
        _SIZE,
    ),
    "llm_d_epp_response_size_bytes": (
        "histogram",
        "Response body size",
        ("model_name", "target_model_name"),
        _SIZE,
    ),
    "inference_objective_response_sizes": (
        "histogram",
        "Deprecated: llm_d_epp_response_size_bytes",
        ("model_name", "target_model_name"),
        _SIZE,
    ),
    "llm_d_epp_request_input_tokens": (
        "histogram",
        "Prompt tokens",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "inference_objective_input_tokens": (
        "histogram",
        "Deprecated: llm_d_epp_request_input_tokens",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "llm_d_epp_request_output_tokens": (
        "histogram",
        "Completion tokens",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "inference_objective_output_tokens": (
        "histogram",
        "Deprecated: llm_d_epp_request_output_tokens",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "llm_d_epp_request_cached_tokens": (
        "histogram",
        "Prompt tokens served from the prefix cache",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "inference_objective_prompt_cached_tokens": (
        "histogram",
        "Deprecated: llm_d_epp_request_cached_tokens",
        ("model_name", "target_model_name"),
        _TOKENS,
    ),
    "llm_d_epp_request_running": (
        "gauge",
        "Requests in flight",
        ("model_name", "target_model_name"),
        (),
    ),
    "inference_objective_running_requests": (
        "gauge",
        "Deprecated: llm_d_epp_request_running",
        ("model_name", "target_model_name"),
        (),
    ),
    "llm_d_epp_request_ttft_seconds": (
        "histogram",
        "Time to first response byte",
        ("model_name", "target_model_name", "streaming"),
        _LATENCY,
    ),
    "llm_d_epp_request_streaming_tpot_seconds": (
        "histogram",
        "Average time per output token of a streamed response: (e2e - TTFT) / (output tokens - 1)",
        ("model_name", "target_model_name", "fairness_id", "priority"),
        (
            0.0005,
            0.00205,
            0.005,
            0.01,
            0.02,
            0.04,
            0.06,
            0.08,
            0.1,
            0.125,
            0.15,
            0.2,
            0.3,
            0.4,
            0.5,
            0.6,
            0.8,
            1.0,
            2.0,
        ),
    ),
    "llm_d_epp_request_streaming_itl_seconds": (
        "histogram",
        "Time between consecutive response body chunks of a streamed response",
        ("model_name", "target_model_name", "fairness_id", "priority"),
        (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0),
    ),
    "llm_d_epp_request_ntpot_seconds": (
        "histogram",
        "Request latency divided by output tokens",
        ("model_name", "target_model_name"),
        _NTPOT,
    ),
    "inference_objective_normalized_time_per_output_token_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_ntpot_seconds",
        ("model_name", "target_model_name"),
        _NTPOT,
    ),
    "llm_d_epp_scheduler_e2e_duration_seconds": ("histogram", "Scheduling latency", (), _SCHEDULER),
    "inference_extension_scheduler_e2e_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_scheduler_e2e_duration_seconds",
        (),
        _SCHEDULER,
    ),
    "llm_d_epp_scheduler_attempts_total": (
        "counter",
        "Scheduling attempts",
        ("status", "target_model_name", "endpoint_name", "namespace", "port"),
        (),
    ),
    "inference_extension_scheduler_attempts_total": (
        "counter",
        "Deprecated: llm_d_epp_scheduler_attempts_total",
        ("status", "target_model_name", "pod_name", "namespace", "port"),
        (),
    ),
    "llm_d_epp_plugin_duration_seconds": (
        "histogram",
        "Plugin latency",
        ("extension_point", "plugin_type", "plugin_name"),
        _PLUGIN,
    ),
    "inference_extension_plugin_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_plugin_duration_seconds",
        ("extension_point", "plugin_type", "plugin_name"),
        _PLUGIN,
    ),
    "llm_d_epp_plugin_errors_total": (
        "counter",
        "Plugin calls that raised",
        ("extension_point", "plugin_type", "plugin_name"),
        (),
    ),
    "llm_d_epp_plugin_data_scope_violations_total": (
        "counter",
        "Endpoint attribute accesses rejected because the plugin did not declare the data key "
        "(this EPP does not restrict access, so nothing is counted)",
        ("extension_point", "plugin_type", "plugin_name", "access"),
        (),
    ),
    "llm_d_epp_request_processing_duration_seconds": (
        "histogram",
        "EPP request processing latency, from request headers until the request body has been "
        "handled, admission control included",
        (),
        (
            0.0005,
            0.001,
            0.002,
            0.005,
            0.01,
            0.015,
            0.025,
            0.04,
            0.06,
            0.1,
            0.25,
            0.5,
            1.0,
            2.5,
            5.0,
            10.0,
        ),
    ),
    "llm_d_epp_response_processing_duration_seconds": (
        "histogram",
        "EPP response processing latency: the sum of per-message handling time of a streamed "
        "response, or response headers to completion for a non-streamed one",
        (),
        (
            0.0001,
            0.00025,
            0.0005,
            0.001,
            0.0025,
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
        ),
    ),
    "llm_d_epp_datalayer_poll_errors_total": (
        "counter",
        "Data-source polls that failed",
        ("source_type",),
        (),
    ),
    "llm_d_inference_scheduler_datalayer_poll_errors_total": (
        "counter",
        "Deprecated: llm_d_epp_datalayer_poll_errors_total",
        ("source_type",),
        (),
    ),
    "llm_d_epp_datalayer_extract_errors_total": (
        "counter",
        "Extractions that failed",
        ("source_type", "extractor_type"),
        (),
    ),
    "llm_d_inference_scheduler_datalayer_extract_errors_total": (
        "counter",
        "Deprecated: llm_d_epp_datalayer_extract_errors_total",
        ("source_type", "extractor_type"),
        (),
    ),
    "llm_d_epp_ready_endpoints": ("gauge", "Endpoints with fresh metrics", ("name",), ()),
    "inference_pool_ready_pods": ("gauge", "Deprecated: llm_d_epp_ready_endpoints", ("name",), ()),
    "llm_d_epp_average_kv_cache_utilization": (
        "gauge",
        "Mean KV-cache utilisation over the pool",
        ("name",),
        (),
    ),
    "inference_pool_average_kv_cache_utilization": (
        "gauge",
        "Deprecated: llm_d_epp_average_kv_cache_utilization",
        ("name",),
        (),
    ),
    "llm_d_epp_average_queue_size": (
        "gauge",
        "Mean waiting-queue length over the pool",
        ("name",),
        (),
    ),
    "inference_pool_average_queue_size": (
        "gauge",
        "Deprecated: llm_d_epp_average_queue_size",
        ("name",),
        (),
    ),
    "llm_d_epp_average_running_requests": (
        "gauge",
        "Mean running requests over the pool",
        ("name",),
        (),
    ),
    "inference_pool_average_running_requests": (
        "gauge",
        "Deprecated: llm_d_epp_average_running_requests",
        ("name",),
        (),
    ),
    "llm_d_epp_std_dev_kv_cache_utilization": (
        "gauge",
        "Standard deviation of KV-cache utilisation over the pool",
        ("name",),
        (),
    ),
    "llm_d_epp_std_dev_queue_size": (
        "gauge",
        "Standard deviation of waiting-queue length over the pool",
        ("name",),
        (),
    ),
    "llm_d_epp_std_dev_running_requests": (
        "gauge",
        "Standard deviation of running requests over the pool",
        ("name",),
        (),
    ),
    "llm_d_epp_per_endpoint_queue_size": (
        "gauge",
        "Queue size per endpoint",
        ("name", "model_server_endpoint"),
        (),
    ),
    "inference_pool_per_pod_queue_size": (
        "gauge",
        "Deprecated: per_endpoint_queue_size",
        ("name", "model_server_pod"),
        (),
    ),
    "llm_d_epp_info": ("gauge", "Build information", ("commit", "build_ref"), ()),
    "inference_extension_info": (
        "gauge",
        "General information of the current build of Inference Extension.",
        ("commit", "build_ref"),
        (),
    ),
    "llm_d_epp_model_rewrite_decisions_total": (
        "counter",
        "Requests whose model an InferenceModelRewrite rule rewrote",
        ("model_rewrite_name", "model_name", "target_model"),
        (),
    ),
    "inference_extension_model_rewrite_decisions_total": (
        "counter",
        "Deprecated: llm_d_epp_model_rewrite_decisions_total",
        ("model_rewrite_name", "model_name", "target_model"),
        (),
    ),
    # Ours, no upstream counterpart: ext_proc protocol misuse (epp.server.stream).
    "llm_d_epp_extproc_protocol_errors_total": (
        "counter",
        "ext_proc streams ended with INVALID_ARGUMENT because the data plane broke the protocol",
        ("reason",),
        (),
    ),
    # Declared for plugins that feed them when configured (epp.plugin.recorders).
    "llm_d_epp_inference_request_metric": (
        "gauge",
        "Consolidated gauge for various inference request metrics including TTFT, TPOT, SLOs, "
        "and prediction durations.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name", "type"),
        (),
    ),
    "inference_objective_inference_request_metric": (
        "gauge",
        "Deprecated: llm_d_epp_inference_request_metric",
        ("model_name", "target_model_name", "type"),
        (),
    ),
    "inference_objective_request_ttft_seconds": (
        "histogram",
        "Inference model TTFT distribution in seconds for each model and target model.",
        ("model_name", "target_model_name"),
        _LATENCY,
    ),
    "llm_d_epp_request_predicted_ttft_seconds": (
        "histogram",
        "Inference model Predicted TTFT distribution in seconds for each model and target model.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name"),
        _LATENCY,
    ),
    "inference_objective_request_predicted_ttft_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_predicted_ttft_seconds",
        ("model_name", "target_model_name"),
        _LATENCY,
    ),
    "llm_d_epp_request_ttft_prediction_duration_seconds": (
        "histogram",
        "Duration taken to generate TTFT predictions in seconds for each model and target model.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name"),
        _PREDICTION,
    ),
    "inference_objective_request_ttft_prediction_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_ttft_prediction_duration_seconds",
        ("model_name", "target_model_name"),
        _PREDICTION,
    ),
    "inference_objective_request_tpot_seconds": (
        "histogram",
        "Inference model TPOT distribution in seconds for each model and target model.",
        ("model_name", "target_model_name"),
        _PREDICTED_TPOT,
    ),
    "llm_d_epp_request_predicted_tpot_seconds": (
        "histogram",
        "Inference model Predicted TPOT distribution in seconds for each model and target model.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name"),
        _PREDICTED_TPOT,
    ),
    "inference_objective_request_predicted_tpot_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_predicted_tpot_seconds",
        ("model_name", "target_model_name"),
        _PREDICTED_TPOT,
    ),
    "llm_d_epp_request_tpot_prediction_duration_seconds": (
        "histogram",
        "Duration taken to generate TPOT predictions in seconds for each model and target model.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name"),
        _PREDICTION,
    ),
    "inference_objective_request_tpot_prediction_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_request_tpot_prediction_duration_seconds",
        ("model_name", "target_model_name"),
        _PREDICTION,
    ),
    "llm_d_epp_request_slo_violation_total": (
        "counter",
        "Counter of SLO violations for each model, target model, and violation type.",
        ("plugin_name", "plugin_type", "model_name", "target_model_name", "type"),
        (),
    ),
    "inference_objective_request_slo_violation_total": (
        "counter",
        "Deprecated: llm_d_epp_request_slo_violation_total",
        ("model_name", "target_model_name", "type"),
        (),
    ),
    "llm_d_epp_disaggregatedset_strict_header_no_match_total": (
        "counter",
        "Strict header selections that matched no endpoint and failed closed.",
        ("plugin_type", "plugin_name", "selector"),
        (),
    ),
    "llm_d_epp_disaggregatedset_revision_gating_share": (
        "gauge",
        "Current weighted revision gating share from 0 to 1; incomplete revisions have share 0.",
        ("plugin_type", "plugin_name", "mode", "revision"),
        (),
    ),
}
FLOW_CONTROL_FAMILIES: Final[dict[str, Family]] = {
    "llm_d_epp_flow_control_request_queue_duration_seconds": (
        "histogram",
        "Time requests spend in flow control, from enqueue to outcome",
        ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
        _QUEUE,
    ),
    "inference_extension_flow_control_request_queue_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_flow_control_request_queue_duration_seconds",
        ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
        _QUEUE,
    ),
    "llm_d_epp_flow_control_dispatch_cycle_duration_seconds": (
        "histogram",
        "Duration of one flow-control dispatch cycle",
        (),
        _SCHEDULER,
    ),
    "inference_extension_flow_control_dispatch_cycle_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_flow_control_dispatch_cycle_duration_seconds",
        (),
        _SCHEDULER,
    ),
    "llm_d_epp_flow_control_request_enqueue_duration_seconds": (
        "histogram",
        "Time taken to enqueue a request into flow control",
        ("fairness_id", "priority", "outcome"),
        _SCHEDULER,
    ),
    "inference_extension_flow_control_request_enqueue_duration_seconds": (
        "histogram",
        "Deprecated: llm_d_epp_flow_control_request_enqueue_duration_seconds",
        ("fairness_id", "priority", "outcome"),
        _SCHEDULER,
    ),
    "llm_d_epp_flow_control_queue_size": (
        "gauge",
        "Requests held in flow-control queues",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "inference_extension_flow_control_queue_size": (
        "gauge",
        "Deprecated: llm_d_epp_flow_control_queue_size",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "llm_d_epp_flow_control_queue_bytes": (
        "gauge",
        "Bytes of requests held in flow-control queues",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "inference_extension_flow_control_queue_bytes": (
        "gauge",
        "Deprecated: llm_d_epp_flow_control_queue_bytes",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "llm_d_epp_flow_control_pool_saturation": (
        "gauge",
        "Pool saturation gating dispatch (stage prefill, decode or effective)",
        ("inference_pool", "stage"),
        (),
    ),
    "inference_extension_flow_control_pool_saturation": (
        "gauge",
        "Deprecated: llm_d_epp_flow_control_pool_saturation",
        ("inference_pool", "stage"),
        (),
    ),
    "llm_d_epp_flow_control_stale_endpoints": (
        "gauge",
        "Candidate endpoints with missing or stale metrics at the last saturation reading",
        ("detector",),
        (),
    ),
    "llm_d_epp_flow_control_capacity_utilization_requests": (
        "gauge",
        "Fraction of a band's request capacity in use",
        ("priority", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_capacity_utilization_bytes": (
        "gauge",
        "Fraction of a band's byte capacity in use",
        ("priority", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_global_capacity_utilization_requests": (
        "gauge",
        "Fraction of the global request capacity in use (only when one is set)",
        ("inference_pool",),
        (),
    ),
    "llm_d_epp_flow_control_global_capacity_utilization_bytes": (
        "gauge",
        "Fraction of the global byte capacity in use (only when one is set)",
        ("inference_pool",),
        (),
    ),
    "llm_d_epp_flow_control_requests_total": (
        "counter",
        "Requests processed by flow control, by outcome",
        ("outcome", "priority", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_revocations_issued_total": (
        "counter",
        "In-flight evictions issued, by the demand band's priority",
        ("priority", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_revocations_total": (
        "counter",
        "In-flight evictions by terminal outcome (confirmed, timed_out)",
        ("outcome", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_reclaim_target": (
        "gauge",
        "Last computed reclamation deficit (saturation units)",
        ("inference_pool",),
        (),
    ),
    "llm_d_epp_flow_control_pending_reclaim": (
        "gauge",
        "Outstanding and cooling reclaim debits (saturation units)",
        ("inference_pool",),
        (),
    ),
    "llm_d_epp_flow_control_revocation_confirmation_seconds": (
        "histogram",
        "Time from eviction to the end of the evicted request's stream",
        ("inference_pool",),
        _CONFIRMATION,
    ),
    # Ours, no upstream counterpart: the view across EPP replicas (epp.flowcontrol.shared).
    "llm_d_epp_flow_control_cross_replica_queue_size": (
        "gauge",
        "Requests queued in flow control across EPP replicas (this one plus its peers as last "
        "reported), by band",
        ("priority", "inference_pool"),
        (),
    ),
    "llm_d_epp_flow_control_cross_replica_peers": (
        "gauge",
        "Other EPP replicas whose flow-control occupancy this replica holds",
        ("inference_pool",),
        (),
    ),
}


def _exposed(family: Any) -> str:
    return str(family._name + "_total" if family._type == "counter" else family._name)


def _families(registry: CollectorRegistry) -> dict[str, Family]:
    """Every family registered, keyed by its exposed name (counters carry ``_total``).

    prometheus_client keeps label names and bucket bounds only on private attributes, and a
    labelled family without children exposes neither, so read them off the collectors."""
    out: dict[str, Family] = {}
    for collector in list(registry._collector_to_names):
        if not isinstance(collector, (Counter, Gauge, Histogram)):
            continue  # process_* (ProcessCollector)
        c: Any = collector
        name = _exposed(c)
        buckets: tuple[float, ...] = ()
        if isinstance(c, Histogram):
            assert math.isinf(c._upper_bounds[-1])
            buckets = tuple(c._upper_bounds[:-1])
        assert name not in out, f"{name} registered twice"
        out[name] = (c._type, c._documentation, tuple(c._labelnames), buckets)
    return out


def _flow_control_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    FlowControlMetrics(registry, "pool")
    return registry


def test_epp_families_match_the_golden_list() -> None:
    assert _families(EppMetrics().registry) == EPP_FAMILIES


def test_flow_control_families_match_the_golden_list() -> None:
    assert _families(_flow_control_registry()) == FLOW_CONTROL_FAMILIES


def test_registration_order_is_unchanged() -> None:
    # Keeps the /metrics exposition itself identical, not just the set of families.
    assert list(_families(EppMetrics().registry)) == list(EPP_FAMILIES)
    assert list(_families(_flow_control_registry())) == list(FLOW_CONTROL_FAMILIES)


@pytest.mark.parametrize(
    ("cls", "table", "wrapper"),
    [
        (EppMetrics, "EPP_METRICS", "_Twin"),
        (FlowControlMetrics, "FLOW_CONTROL_METRICS", "_Pair"),
    ],
)
def test_every_table_row_is_a_declared_attribute_of_its_type(
    cls: type[Any], table: str, wrapper: str
) -> None:
    module = epp_metrics if cls is EppMetrics else fc_metrics
    instance = cls() if cls is EppMetrics else cls(CollectorRegistry(), "pool")
    hints = typing.get_type_hints(cls)
    rows = getattr(module, table)
    assert len({row.attr for row in rows}) == len(rows)
    for row in rows:
        value = getattr(instance, row.attr)
        expected = getattr(module, wrapper) if row.twin else row.kind
        assert isinstance(value, expected), row.attr  # a histogram is a FastHistogram
        assert hints[row.attr] is expected, row.attr
        # The wrappers feed their first family the canonical labels, the rest the twin labels.
        if row.twin:
            inner = value._metrics if expected is epp_metrics._Twin else value._families
            assert [_exposed(f) for f in inner] == [row.name, row.twin], row.attr
        else:
            assert _exposed(value) == row.name, row.attr
