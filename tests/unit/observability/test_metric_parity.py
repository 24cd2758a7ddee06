"""Metric families against upstream's list (the reference digest of llm-d-router, §9), so
upstream's dashboards and alerts find every family they key on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from prometheus_client import generate_latest

from epp.app import App
from epp.observability.metrics import EppMetrics
from epp.observability.pool import refresh_pool_gauges
from epp.plugin import Endpoint, Metrics
from tests.conftest import endpoints_yaml, epp_config, make_settings
from tests.epp_metric_names import UPSTREAM_METRIC_FAMILIES

# Spec §9, canonical names (prefix llm_d_epp_) and their deprecated twins, as exposed.
CANONICAL: Final = (
    "request_total", "request_error_total", "request_duration_seconds", "request_size_bytes",
    "response_size_bytes", "request_input_tokens", "request_output_tokens",
    "request_cached_tokens", "request_running", "request_ntpot_seconds", "request_ttft_seconds",
    "request_streaming_tpot_seconds", "request_streaming_itl_seconds",
    "average_kv_cache_utilization", "average_queue_size", "average_running_requests",
    "std_dev_kv_cache_utilization", "std_dev_queue_size", "std_dev_running_requests",
    "ready_endpoints", "per_endpoint_queue_size", "scheduler_e2e_duration_seconds",
    "scheduler_attempts_total", "plugin_duration_seconds", "plugin_data_scope_violations_total",
    "request_processing_duration_seconds", "response_processing_duration_seconds", "info",
    "model_rewrite_decisions_total", "datalayer_poll_errors_total",
    "datalayer_extract_errors_total",
    # with the flowControl feature gate
    "flow_control_request_queue_duration_seconds", "flow_control_dispatch_cycle_duration_seconds",
    "flow_control_request_enqueue_duration_seconds", "flow_control_queue_size",
    "flow_control_queue_bytes", "flow_control_pool_saturation", "flow_control_stale_endpoints",
    "flow_control_capacity_utilization_requests", "flow_control_capacity_utilization_bytes",
    "flow_control_requests_total", "flow_control_revocations_issued_total",
    "flow_control_revocations_total", "flow_control_reclaim_target",
    "flow_control_pending_reclaim", "flow_control_revocation_confirmation_seconds",
)  # fmt: skip
TWINS: Final = (
    "inference_objective_request_total", "inference_objective_request_error_total",
    "inference_objective_request_duration_seconds", "inference_objective_request_sizes",
    "inference_objective_response_sizes", "inference_objective_input_tokens",
    "inference_objective_output_tokens", "inference_objective_prompt_cached_tokens",
    "inference_objective_running_requests",
    "inference_objective_normalized_time_per_output_token_seconds",
    "inference_pool_average_kv_cache_utilization", "inference_pool_average_queue_size",
    "inference_pool_average_running_requests", "inference_pool_ready_pods",
    "inference_pool_per_pod_queue_size", "inference_extension_scheduler_e2e_duration_seconds",
    "inference_extension_scheduler_attempts_total", "inference_extension_plugin_duration_seconds",
    "inference_extension_info", "inference_extension_model_rewrite_decisions_total",
    "llm_d_inference_scheduler_datalayer_poll_errors_total",
    "llm_d_inference_scheduler_datalayer_extract_errors_total",
    "inference_extension_flow_control_request_queue_duration_seconds",
)  # fmt: skip
FLOW: Final = """\
featureGates: [flowControl]
plugins:
- type: queue-scorer
flowControl:
  enableEviction: true
"""


def _exposed(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


def test_every_upstream_family_is_exposed_when_flow_control_is_on(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml([1]))
    app = App(make_settings(epp_config(endpoints, FLOW)))
    text = generate_latest(app.metrics.registry).decode()
    families = _exposed(text)
    missing = {f"llm_d_epp_{name}" for name in CANONICAL} - families
    assert not missing, sorted(missing)
    assert not set(TWINS) - families, sorted(set(TWINS) - families)
    assert any(f.startswith("process_") for f in families)
    assert not re.search(r"^\w+_created[{ ]", text, re.M)  # no *_created series, as upstream


# Every plugin type that owns upstream families, on one pool: the disaggregation handler is
# swapped for the deprecated pd-profile-handler in a second App (one handler per config), since
# each counts its decisions under its own family.
EVERY_FAMILY = """\
featureGates: [flowControl]
plugins:
- type: token-producer
- type: approx-prefix-cache-producer
- type: inflight-load-producer
- type: mm-embeddings-cache-producer
- type: precise-prefix-cache-producer
  parameters:
    indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}
- type: prefix-cache-scorer
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
- type: program-aware-fairness
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
flowControl:
  enableEviction: true
"""
_DISAGG = (
    "type: disagg-profile-handler\n  parameters: {deciders: {prefill: prefix-based-pd-decider}}"
)


def test_the_golden_list_is_upstreams_137_families() -> None:
    assert len(UPSTREAM_METRIC_FAMILIES) == len(set(UPSTREAM_METRIC_FAMILIES)) == 137
    assert {f"llm_d_epp_{name}" for name in CANONICAL} <= set(UPSTREAM_METRIC_FAMILIES)
    assert set(TWINS) <= set(UPSTREAM_METRIC_FAMILIES)


def test_every_one_of_upstreams_137_families_is_exposed_when_its_plugins_are_configured(
    tmp_path: Path,
) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(endpoints_yaml([1]))
    exposed: set[str] = set()
    for body in (EVERY_FAMILY, EVERY_FAMILY.replace(_DISAGG, "type: pd-profile-handler")):
        settings = make_settings(
            epp_config(endpoints, body),
            enable_grpc_stream_metrics=True,
            allow_experimental_plugins=True,
        )
        exposed |= _exposed(generate_latest(App(settings).metrics.registry).decode())
    missing = sorted(set(UPSTREAM_METRIC_FAMILIES) - exposed)
    assert not missing, missing


def test_info_is_one_with_the_build_when_exposed() -> None:
    text = generate_latest(EppMetrics().registry).decode()
    for family in ("llm_d_epp_info", "inference_extension_info"):
        assert re.search(rf'^{family}{{build_ref="[^"]+",commit="[^"]*"}} 1\.0$', text, re.M)


def _pod(name: str, queue: int) -> Endpoint:
    metrics = Metrics(waiting_queue_size=queue, update_time=10.0)
    return Endpoint(f"ns/{name}", name, "ns", "10.0.0.1", 8000, metrics=metrics)


def test_per_endpoint_queue_names_the_endpoint_and_forgets_departed_ones_when_refreshed() -> None:
    m = EppMetrics()
    pods = [_pod(f"vllm-{i}-rank-0", 3) for i in range(3)]
    refresh_pool_gauges(m, pods, pool="pool", staleness=2.0, now=10.5)
    refresh_pool_gauges(m, pods[:2], pool="pool", staleness=2.0, now=10.5)
    text = generate_latest(m.registry).decode()
    lines = re.findall(r"^llm_d_epp_per_endpoint_queue_size\{(.*)\} (\S+)$", text, re.M)
    assert lines == [
        ('model_server_endpoint="vllm-0-rank-0",name="pool"', "3.0"),
        ('model_server_endpoint="vllm-1-rank-0",name="pool"', "3.0"),
    ]
    assert 'inference_pool_per_pod_queue_size{model_server_pod="vllm-1-rank-0",name="pool"}' in text


def test_pool_deviation_is_the_sample_standard_deviation_when_refreshed() -> None:
    m = EppMetrics()
    refresh_pool_gauges(
        m, [_pod("p0", 1), _pod("p1", 2), _pod("p2", 6)], pool="pool", staleness=2.0, now=10.0
    )
    text = generate_latest(m.registry).decode()
    assert 'llm_d_epp_average_queue_size{name="pool"} 3.0' in text
    assert 'llm_d_epp_std_dev_queue_size{name="pool"} 2.65' in text  # sqrt(14 / 2), 2 decimals
