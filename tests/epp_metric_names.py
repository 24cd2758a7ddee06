"""The Prometheus series names an EPP exposes, read from a real ``App``'s registry, for the checks
that dashboards and alert rules name only metrics that exist.

The App is built (not started) from ``deploy/configs/flow-control.yaml`` plus a ``redis-syncer``,
so the engine's families, flow control's, cross-replica sync's and those of the plugins that
register their own (prefix indexer, program-aware fairness, the syncer) are all there. The model
servers' series the EPP scrapes by default (vLLM's, which the dashboard's per-endpoint KV-cache
panel reads) are listed separately.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


UPSTREAM_METRIC_FAMILIES: tuple[str, ...] = (
    "inference_extension_flow_control_dispatch_cycle_duration_seconds",
    "inference_extension_flow_control_pool_saturation",
    "inference_extension_flow_control_queue_bytes", "inference_extension_flow_control_queue_size",
    "inference_extension_flow_control_request_enqueue_duration_seconds",
    "inference_extension_flow_control_request_queue_duration_seconds", "inference_extension_info",
    "inference_extension_model_rewrite_decisions_total",
    "inference_extension_plugin_duration_seconds", "inference_extension_prefix_indexer_hit_bytes",
    "inference_extension_prefix_indexer_hit_ratio", "inference_extension_prefix_indexer_size",
    "inference_extension_scheduler_attempts_total",
    "inference_extension_scheduler_e2e_duration_seconds",
    "inference_objective_inference_request_metric", "inference_objective_input_tokens",
    "inference_objective_normalized_time_per_output_token_seconds",
    "inference_objective_output_tokens", "inference_objective_prompt_cached_tokens",
    "inference_objective_request_duration_seconds", "inference_objective_request_error_total",
    "inference_objective_request_predicted_tpot_seconds",
    "inference_objective_request_predicted_ttft_seconds", "inference_objective_request_sizes",
    "inference_objective_request_slo_violation_total", "inference_objective_request_total",
    "inference_objective_request_tpot_prediction_duration_seconds",
    "inference_objective_request_tpot_seconds",
    "inference_objective_request_ttft_prediction_duration_seconds",
    "inference_objective_request_ttft_seconds", "inference_objective_response_sizes",
    "inference_objective_running_requests", "inference_pool_average_kv_cache_utilization",
    "inference_pool_average_queue_size", "inference_pool_average_running_requests",
    "inference_pool_per_pod_queue_size", "inference_pool_ready_pods",
    "kvcache_index_admissions_total", "kvcache_index_evictions_total",
    "kvcache_index_lookup_hits_total", "kvcache_index_lookup_latency_seconds",
    "kvcache_index_lookup_requests_total", "kvcache_index_max_pod_hit_count_total",
    "kvcache_kvevents_dedup_removed_hashes_forwarded_total",
    "kvcache_kvevents_dedup_removed_hashes_suppressed_total",
    "llm_d_epp_average_kv_cache_utilization", "llm_d_epp_average_queue_size",
    "llm_d_epp_average_running_requests", "llm_d_epp_datalayer_extract_errors_total",
    "llm_d_epp_datalayer_poll_errors_total", "llm_d_epp_disagg_decision_total",
    "llm_d_epp_disaggregatedset_revision_gating_share",
    "llm_d_epp_disaggregatedset_strict_header_no_match_total",
    "llm_d_epp_encoder_cache_hit_ratio", "llm_d_epp_encoder_cache_hits_total",
    "llm_d_epp_encoder_cache_queries_total", "llm_d_epp_extproc_stream_duration_seconds",
    "llm_d_epp_extproc_streams_inflight", "llm_d_epp_extproc_streams_total",
    "llm_d_epp_flow_control_capacity_utilization_bytes",
    "llm_d_epp_flow_control_capacity_utilization_requests",
    "llm_d_epp_flow_control_dispatch_cycle_duration_seconds",
    "llm_d_epp_flow_control_global_capacity_utilization_bytes",
    "llm_d_epp_flow_control_global_capacity_utilization_requests",
    "llm_d_epp_flow_control_pending_reclaim", "llm_d_epp_flow_control_pool_saturation",
    "llm_d_epp_flow_control_queue_bytes", "llm_d_epp_flow_control_queue_size",
    "llm_d_epp_flow_control_reclaim_target",
    "llm_d_epp_flow_control_request_enqueue_duration_seconds",
    "llm_d_epp_flow_control_request_queue_duration_seconds",
    "llm_d_epp_flow_control_requests_total",
    "llm_d_epp_flow_control_revocation_confirmation_seconds",
    "llm_d_epp_flow_control_revocations_issued_total", "llm_d_epp_flow_control_revocations_total",
    "llm_d_epp_flow_control_stale_endpoints", "llm_d_epp_inference_request_metric",
    "llm_d_epp_inflight_requests", "llm_d_epp_inflight_tokens", "llm_d_epp_info",
    "llm_d_epp_kv_cache_events_active_subscribers",
    "llm_d_epp_kv_cache_events_dedup_removed_hashes_forwarded_total",
    "llm_d_epp_kv_cache_events_dedup_removed_hashes_suppressed_total",
    "llm_d_epp_kv_cache_events_messages_received_total",
    "llm_d_epp_kv_cache_events_pool_capacity", "llm_d_epp_kv_cache_events_pool_queue_depth",
    "llm_d_epp_kv_cache_events_removals_skipped_total",
    "llm_d_epp_kv_cache_events_stores_skipped_total",
    "llm_d_epp_kv_cache_events_subscriber_reconnections_total",
    "llm_d_epp_kv_cache_events_zmq_errors_total", "llm_d_epp_kv_cache_index_admissions_total",
    "llm_d_epp_kv_cache_index_evictions_total", "llm_d_epp_kv_cache_index_lookup_hits_total",
    "llm_d_epp_kv_cache_index_lookup_latency_seconds",
    "llm_d_epp_kv_cache_index_lookup_requests_total",
    "llm_d_epp_kv_cache_index_max_pod_hit_count_total", "llm_d_epp_model_rewrite_decisions_total",
    "llm_d_epp_pd_decision_total", "llm_d_epp_per_endpoint_queue_size",
    "llm_d_epp_plugin_data_scope_violations_total", "llm_d_epp_plugin_duration_seconds",
    "llm_d_epp_prefix_indexer_hit_bytes", "llm_d_epp_prefix_indexer_hit_ratio",
    "llm_d_epp_prefix_indexer_size", "llm_d_epp_program_aware_attained_service_tokens",
    "llm_d_epp_program_aware_avg_wait_time_milliseconds",
    "llm_d_epp_program_aware_jains_fairness_index", "llm_d_epp_ready_endpoints",
    "llm_d_epp_request_cached_tokens", "llm_d_epp_request_duration_seconds",
    "llm_d_epp_request_error_total", "llm_d_epp_request_input_tokens",
    "llm_d_epp_request_ntpot_seconds", "llm_d_epp_request_output_tokens",
    "llm_d_epp_request_predicted_tpot_seconds", "llm_d_epp_request_predicted_ttft_seconds",
    "llm_d_epp_request_processing_duration_seconds", "llm_d_epp_request_running",
    "llm_d_epp_request_size_bytes", "llm_d_epp_request_slo_violation_total",
    "llm_d_epp_request_streaming_itl_seconds", "llm_d_epp_request_streaming_tpot_seconds",
    "llm_d_epp_request_total", "llm_d_epp_request_tpot_prediction_duration_seconds",
    "llm_d_epp_request_ttft_prediction_duration_seconds", "llm_d_epp_request_ttft_seconds",
    "llm_d_epp_response_processing_duration_seconds", "llm_d_epp_response_size_bytes",
    "llm_d_epp_scheduler_attempts_total", "llm_d_epp_scheduler_e2e_duration_seconds",
    "llm_d_epp_std_dev_kv_cache_utilization", "llm_d_epp_std_dev_queue_size",
    "llm_d_epp_std_dev_running_requests",
    "llm_d_inference_scheduler_datalayer_extract_errors_total",
    "llm_d_inference_scheduler_datalayer_poll_errors_total",
    "llm_d_inference_scheduler_disagg_decision_total",
    "llm_d_inference_scheduler_pd_decision_total",
)  # fmt: skip
"""Every metric family llm-d-router's EPP registers (commit ebab687, v0.10.0 and a few commits),
as exposed (counters with ``_total``): the engine's, flow control's, the ext_proc stream metrics,
and those of the plugins that own theirs (prefix indexer, encoder cache, program-aware fairness,
disaggregation deciders, in-flight load, predicted latency, DisaggregatedSet rollouts, the
precise-prefix index and its KV-event health), with every deprecated twin. 137 names."""


@functools.cache
def epp_series_names() -> frozenset[str]:
    from epp.app import App
    from tests.conftest import make_settings

    config = yaml.safe_load((ROOT / "deploy/configs/flow-control.yaml").read_text())
    config["plugins"].append({"type": "redis-syncer", "parameters": {"url": "redis://127.0.0.1:1"}})
    config["dataLayer"]["crossReplicaSyncerPluginRef"] = "redis-syncer"
    app = App(make_settings(yaml.safe_dump(config), allow_experimental_plugins=True))
    names: set[str] = set()
    for family in app.metrics.registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return frozenset(names)


@functools.cache
def model_server_series_names() -> frozenset[str]:
    """vLLM's series the built-in engine mapping reads (queue, running, KV cache, LoRA)."""
    from epp.plugins.sources.engines import BUILTIN_ENGINES, parse_spec

    (vllm,) = [e for e in BUILTIN_ENGINES if e.name == "vllm"]
    specs = (vllm.queued_requests_spec, vllm.running_requests_spec, vllm.kv_usage_spec)
    return frozenset(spec.name for spec in map(parse_spec, specs) if spec is not None)


_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
     "bool", "offset", "inf", "nan"}
)  # fmt: skip
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are neither functions,
    keywords, label names (in ``{}`` matchers or grouping clauses), strings nor variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call is None and name.lower() not in _KEYWORDS:
            names.add(name)
    return names
