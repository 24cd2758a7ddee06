"""Upstream's predicted-latency metric families, recorded by ``predicted-latency-producer``.

This module is the one place the producer records metrics. The families carry llm-d-router's
names, label sets and buckets (its ``predictedlatency/metrics.go``); ``metric_family`` returns a
family already registered on the App's registry under that name, so when the EPP's own metrics
(``epp.observability``) define them, the producer records into those.

=================================================================  =====================
family                                                             labels
=================================================================  =====================
``llm_d_epp_request_predicted_ttft_seconds`` (histogram)           plugin, model
``llm_d_epp_request_predicted_tpot_seconds`` (histogram)           plugin, model
``llm_d_epp_request_ttft_prediction_duration_seconds`` (histogram)  plugin, model
``llm_d_epp_request_tpot_prediction_duration_seconds`` (histogram)  plugin, model
``llm_d_epp_request_slo_violation_total`` (counter)                plugin, model, type
``llm_d_epp_inference_request_metric`` (gauge)                     plugin, model, type
``inference_objective_request_ttft_seconds`` (histogram)           model (deprecated)
``inference_objective_request_tpot_seconds`` (histogram)           model (deprecated)
``inference_objective_request_predicted_ttft_seconds`` and the     model (deprecated)
other ``inference_objective_*`` twins of the families above
=================================================================  =====================

plugin = ``plugin_name``, ``plugin_type``; model = ``model_name``, ``target_model_name``; the
gauge's ``type`` is ``ttft``, ``predicted_ttft``, ``ttft_prediction_duration``,
``ttft_slo_violation`` and the same for ``tpot`` (its last value), the counter's ``ttft`` or
``tpot``. Latencies are recorded in seconds; a request's SLO violation compares milliseconds.
"""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.plugin.metrics import metric_family

_MODEL: Final = ("model_name", "target_model_name")
_PLUGIN: Final = ("plugin_name", "plugin_type", *_MODEL)
LATENCY_BUCKETS: Final = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TPOT_BUCKETS: Final = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
PREDICTION_BUCKETS: Final = (
    0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip

# key -> (kind, name, help, labels, buckets); "old_*" are the deprecated inference_objective_ twins
_FAMILIES: Final[dict[str, tuple[type[Any], str, str, tuple[str, ...], tuple[float, ...]]]] = {
    "gauge": (Gauge, "llm_d_epp_inference_request_metric",
              "Consolidated gauge for various inference request metrics including TTFT, TPOT, "
              "SLOs, and prediction durations.", (*_PLUGIN, "type"), ()),
    "old_gauge": (Gauge, "inference_objective_inference_request_metric",
                  "[Deprecated: Use llm_d_epp_inference_request_metric] Consolidated gauge for "
                  "various inference request metrics.", (*_MODEL, "type"), ()),
    "old_ttft": (Histogram, "inference_objective_request_ttft_seconds",
                 "[Deprecated: Use llm_d_epp_request_ttft_seconds] Inference model TTFT "
                 "distribution in seconds.", _MODEL, LATENCY_BUCKETS),
    "predicted_ttft": (Histogram, "llm_d_epp_request_predicted_ttft_seconds",
                       "Inference model Predicted TTFT distribution in seconds.", _PLUGIN,
                       LATENCY_BUCKETS),
    "old_predicted_ttft": (Histogram, "inference_objective_request_predicted_ttft_seconds",
                           "[Deprecated: Use llm_d_epp_request_predicted_ttft_seconds] Inference "
                           "model Predicted TTFT distribution in seconds.", _MODEL,
                           LATENCY_BUCKETS),
    "ttft_duration": (Histogram, "llm_d_epp_request_ttft_prediction_duration_seconds",
                      "Duration taken to generate TTFT predictions in seconds.", _PLUGIN,
                      PREDICTION_BUCKETS),
    "old_ttft_duration": (Histogram, "inference_objective_request_ttft_prediction_duration_seconds",
                          "[Deprecated: Use llm_d_epp_request_ttft_prediction_duration_seconds] "
                          "Duration taken to generate TTFT predictions in seconds.", _MODEL,
                          PREDICTION_BUCKETS),
    "old_tpot": (Histogram, "inference_objective_request_tpot_seconds",
                 "[Deprecated: Use llm_d_epp_request_streaming_tpot_seconds] Inference model TPOT "
                 "distribution in seconds.", _MODEL, TPOT_BUCKETS),
    "predicted_tpot": (Histogram, "llm_d_epp_request_predicted_tpot_seconds",
                       "Inference model Predicted TPOT distribution in seconds.", _PLUGIN,
                       TPOT_BUCKETS),
    "old_predicted_tpot": (Histogram, "inference_objective_request_predicted_tpot_seconds",
                           "[Deprecated: Use llm_d_epp_request_predicted_tpot_seconds] Inference "
                           "model Predicted TPOT distribution in seconds.", _MODEL, TPOT_BUCKETS),
    "tpot_duration": (Histogram, "llm_d_epp_request_tpot_prediction_duration_seconds",
                      "Duration taken to generate TPOT predictions in seconds.", _PLUGIN,
                      PREDICTION_BUCKETS),
    "old_tpot_duration": (Histogram, "inference_objective_request_tpot_prediction_duration_seconds",
                          "[Deprecated: Use llm_d_epp_request_tpot_prediction_duration_seconds] "
                          "Duration taken to generate TPOT predictions in seconds.", _MODEL,
                          PREDICTION_BUCKETS),
    "violations": (Counter, "llm_d_epp_request_slo_violation",
                   "Counter of SLO violations for each model, target model, and violation type.",
                   (*_PLUGIN, "type"), ()),
    "old_violations": (Counter, "inference_objective_request_slo_violation",
                       "[Deprecated: Use llm_d_epp_request_slo_violation_total] Counter of SLO "
                       "violations for each model, target model, and violation type.",
                       (*_MODEL, "type"), ()),
}  # fmt: skip


class LatencyMetrics:
    """The families above, bound to one producer instance (its name and type)."""

    def __init__(self, registry: CollectorRegistry, plugin_name: str, plugin_type: str) -> None:
        self._plugin = (plugin_name, plugin_type)
        self._f: dict[str, Any] = {}
        for key, (kind, name, doc, labels, buckets) in _FAMILIES.items():
            extra = {"buckets": buckets} if buckets else {}
            self._f[key] = metric_family(registry, kind, name, doc, labels, **extra)

    def _gauge(self, model: tuple[str, str], kind: str, value: float) -> None:
        self._f["gauge"].labels(*self._plugin, *model, kind).set(value)
        self._f["old_gauge"].labels(*model, kind).set(value)

    def measured(self, target: str, model: tuple[str, str], seconds: float) -> None:
        """A request's measured TTFT (``target="ttft"``) or TPOT (``"tpot"``)."""
        if seconds < 0:
            return
        self._f[f"old_{target}"].labels(*model).observe(seconds)
        self._gauge(model, target, seconds)

    def predicted(self, target: str, model: tuple[str, str], seconds: float) -> None:
        if seconds < 0:
            return
        self._f[f"predicted_{target}"].labels(*self._plugin, *model).observe(seconds)
        self._f[f"old_predicted_{target}"].labels(*model).observe(seconds)
        self._gauge(model, f"predicted_{target}", seconds)

    def prediction_duration(self, model: tuple[str, str], seconds: float) -> None:
        """One prediction call's duration: upstream records it as both the TTFT and the TPOT
        prediction duration (one call predicts both)."""
        for target in ("ttft", "tpot"):
            self._f[f"{target}_duration"].labels(*self._plugin, *model).observe(seconds)
            self._f[f"old_{target}_duration"].labels(*model).observe(seconds)
            self._gauge(model, f"{target}_prediction_duration", seconds)

    def slo(self, target: str, model: tuple[str, str], measured_ms: float, slo_ms: float) -> None:
        """Compare a measurement with its SLO (both in ms): a violation is counted."""
        violated = measured_ms > slo_ms
        if violated:
            self._f["violations"].labels(*self._plugin, *model, target).inc()
            self._f["old_violations"].labels(*model, target).inc()
        self._gauge(model, f"{target}_slo_violation", 1.0 if violated else 0.0)
