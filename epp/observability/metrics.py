"""Prometheus metrics of one EPP (one ``CollectorRegistry`` per App).

Names follow upstream (spec §9): canonical ``llm_d_epp_*`` families, plus the deprecated twins
(``inference_objective_*``, ``inference_pool_*``, ``inference_extension_*``) so existing dashboards
keep working. Model-name labels share a cap of 1000 distinct values; past it they read ``other``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

MODEL_LABEL_CAP: Final = 1000
OTHER: Final = "other"

_LATENCY_BUCKETS: Final = (
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
    2,
    3,
    4,
    5,
    6,
    8,
    10,
    15,
    20,
    30,
    45,
    60,
    120,
    180,
    240,
    300,
    360,
    480,
    600,
    900,
    1200,
    1800,
    2700,
    3600,
)
_SCHED_BUCKETS: Final = (
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
_PLUGIN_BUCKETS: Final = (
    0.00001,
    0.00002,
    0.00005,
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
_TOKEN_BUCKETS: Final = (
    1,
    8,
    16,
    32,
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32778,
    65536,
    131072,
    262144,
    524288,
    1048576,
)
_SIZE_BUCKETS: Final = (
    64,
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
    32768,
    65536,
    131072,
    262144,
    524288,
    1048576,
    2097152,
    4194304,
    8388608,
    16777216,
    33554432,
    67108864,
    134217728,
)

MODEL_LABELS: Final = ("model_name", "target_model_name")


class LabelCap:
    """Folds label values beyond ``cap`` distinct ones into ``other`` (thread-safe)."""

    def __init__(self, cap: int = MODEL_LABEL_CAP) -> None:
        self._cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self._cap:
                return OTHER
            self._seen.add(value)
            return value


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


class EppMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_cap = LabelCap()
        r = self.registry
        req = ("model_name", "target_model_name", "fairness_id", "priority")
        self.request_total = _Twin(
            Counter("llm_d_epp_request_total", "Requests handled", req, registry=r),
            Counter(
                "inference_objective_request_total",
                "Deprecated: llm_d_epp_request_total",
                ("model_name", "target_model_name", "priority"),
                registry=r,
            ),
        )
        err = (*MODEL_LABELS, "error_code")
        self.request_errors = _Twin(
            Counter("llm_d_epp_request_error_total", "Requests that failed", err, registry=r),
            Counter(
                "inference_objective_request_error_total",
                "Deprecated: llm_d_epp_request_error_total",
                err,
                registry=r,
            ),
        )
        self.request_duration = self._hist(
            "request_duration_seconds",
            "inference_objective_request_duration_seconds",
            "End-to-end request latency seen by the EPP",
            _LATENCY_BUCKETS,
        )
        self.request_size = self._hist(
            "request_size_bytes",
            "inference_objective_request_sizes",
            "Request body size",
            _SIZE_BUCKETS,
        )
        self.response_size = self._hist(
            "response_size_bytes",
            "inference_objective_response_sizes",
            "Response body size",
            _SIZE_BUCKETS,
        )
        self.input_tokens = self._hist(
            "request_input_tokens",
            "inference_objective_input_tokens",
            "Prompt tokens",
            _TOKEN_BUCKETS,
        )
        self.output_tokens = self._hist(
            "request_output_tokens",
            "inference_objective_output_tokens",
            "Completion tokens",
            _TOKEN_BUCKETS,
        )
        self.cached_tokens = self._hist(
            "request_cached_tokens",
            "inference_objective_prompt_cached_tokens",
            "Prompt tokens served from the prefix cache",
            _TOKEN_BUCKETS,
        )
        self.running = _Twin(
            Gauge("llm_d_epp_request_running", "Requests in flight", MODEL_LABELS, registry=r),
            Gauge(
                "inference_objective_running_requests",
                "Deprecated: llm_d_epp_request_running",
                MODEL_LABELS,
                registry=r,
            ),
        )
        self.ttft = Histogram(
            "llm_d_epp_request_ttft_seconds",
            "Time to first response byte",
            (*MODEL_LABELS, "streaming"),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ntpot = self._hist(
            "request_ntpot_seconds",
            "inference_objective_normalized_time_per_output_token_seconds",
            "Request latency divided by output tokens",
            (*_SCHED_BUCKETS, 0.2, 0.5, 1.0),
        )
        self.scheduler_e2e = _Twin(
            Histogram(
                "llm_d_epp_scheduler_e2e_duration_seconds",
                "Scheduling latency",
                buckets=_SCHED_BUCKETS,
                registry=r,
            ),
            Histogram(
                "inference_extension_scheduler_e2e_duration_seconds",
                "Deprecated: llm_d_epp_scheduler_e2e_duration_seconds",
                buckets=_SCHED_BUCKETS,
                registry=r,
            ),
        )
        att = ("status", "target_model_name", "endpoint_name", "namespace", "port")
        self.scheduler_attempts = Counter(
            "llm_d_epp_scheduler_attempts_total", "Scheduling attempts", att, registry=r
        )
        plug = ("extension_point", "plugin_type", "plugin_name")
        self.plugin_duration = _Twin(
            Histogram(
                "llm_d_epp_plugin_duration_seconds",
                "Plugin latency",
                plug,
                buckets=_PLUGIN_BUCKETS,
                registry=r,
            ),
            Histogram(
                "inference_extension_plugin_duration_seconds",
                "Deprecated: llm_d_epp_plugin_duration_seconds",
                plug,
                buckets=_PLUGIN_BUCKETS,
                registry=r,
            ),
        )
        self.plugin_errors = Counter(
            "llm_d_epp_plugin_errors_total", "Plugin calls that raised", plug, registry=r
        )
        self.poll_errors = Counter(
            "llm_d_epp_datalayer_poll_errors_total",
            "Data-source polls that failed",
            ("source_type",),
            registry=r,
        )
        self.extract_errors = Counter(
            "llm_d_epp_datalayer_extract_errors_total",
            "Extractions that failed",
            ("source_type", "extractor_type"),
            registry=r,
        )
        pool = ("name",)
        self.ready_endpoints = self._gauge_twin(
            "ready_endpoints", "inference_pool_ready_pods", "Endpoints with fresh metrics", pool
        )
        self.avg_kv = self._gauge_twin(
            "average_kv_cache_utilization",
            "inference_pool_average_kv_cache_utilization",
            "Mean KV-cache utilisation over the pool",
            pool,
        )
        self.avg_queue = self._gauge_twin(
            "average_queue_size",
            "inference_pool_average_queue_size",
            "Mean waiting-queue length over the pool",
            pool,
        )
        self.avg_running = self._gauge_twin(
            "average_running_requests",
            "inference_pool_average_running_requests",
            "Mean running requests over the pool",
            pool,
        )
        self.per_endpoint_queue = _Twin(
            Gauge(
                "llm_d_epp_per_endpoint_queue_size",
                "Queue size per endpoint",
                ("name", "model_server_endpoint"),
                registry=r,
            ),
            Gauge(
                "inference_pool_per_pod_queue_size",
                "Deprecated: per_endpoint_queue_size",
                ("name", "model_server_pod"),
                registry=r,
            ),
        )
        self.info = Gauge(
            "llm_d_epp_info", "Build information", ("commit", "build_ref"), registry=r
        )
        rewrite = ("model_rewrite_name", "model_name", "target_model")
        self.model_rewrites = _Twin(
            Counter(
                "llm_d_epp_model_rewrite_decisions_total",
                "Requests whose model an InferenceModelRewrite rule rewrote",
                rewrite,
                registry=r,
            ),
            Counter(
                "inference_extension_model_rewrite_decisions_total",
                "Deprecated: llm_d_epp_model_rewrite_decisions_total",
                rewrite,
                registry=r,
            ),
        )

    def _hist(self, name: str, twin: str, doc: str, buckets: Sequence[float]) -> _Twin:
        return _Twin(
            Histogram(
                f"llm_d_epp_{name}", doc, MODEL_LABELS, buckets=buckets, registry=self.registry
            ),
            Histogram(
                twin,
                f"Deprecated: llm_d_epp_{name}",
                MODEL_LABELS,
                buckets=buckets,
                registry=self.registry,
            ),
        )

    def _gauge_twin(self, name: str, twin: str, doc: str, labels: Sequence[str]) -> _Twin:
        return _Twin(
            Gauge(f"llm_d_epp_{name}", doc, labels, registry=self.registry),
            Gauge(twin, f"Deprecated: llm_d_epp_{name}", labels, registry=self.registry),
        )

    def models(self, model: str, target: str) -> tuple[str, str]:
        return self.model_cap(model), self.model_cap(target)
