"""Upstream's predicted-latency metric families, recorded by ``predicted-latency-producer``.

This module is the one place the producer records metrics (``LatencyMetrics``, whose methods are
named after what they record). The families carry llm-d-router's names, label sets and buckets
(its ``predictedlatency/metrics.go``); ``metric_family`` returns a family already registered on
the App's registry under that name, so when the EPP's own metrics (``epp.observability``) declare
them, the producer records into those.

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
from epp.plugin.types import TypedName

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
    """The families above, recorded under one producer's ``plugin_name`` and ``plugin_type``.
    Times in seconds; a negative value is not recorded (the call returns ``False``)."""

    def __init__(self, registry: CollectorRegistry, plugin: TypedName) -> None:
        self._plugin = (plugin.name, plugin.type)
        self._f: dict[str, Any] = {}
        for key, (kind, name, doc, labels, buckets) in _FAMILIES.items():
            extra = {"buckets": buckets} if buckets else {}
            self._f[key] = metric_family(registry, kind, name, doc, labels, **extra)

    def _gauge(self, model: str, target: str, kind: str, value: float) -> None:
        self._f["gauge"].labels(*self._plugin, model, target, kind).set(value)
        self._f["old_gauge"].labels(model, target, kind).set(value)

    def _observe(self, key: str, model: str, target: str, seconds: float) -> bool:
        if seconds < 0:
            return False
        if key in self._f:  # the measured TTFT and TPOT have only the deprecated family
            self._f[key].labels(*self._plugin, model, target).observe(seconds)
        self._f[f"old_{key}"].labels(model, target).observe(seconds)
        self._gauge(model, target, key.replace("_duration", "_prediction_duration"), seconds)
        return True

    def ttft(self, model: str, target: str, seconds: float) -> bool:
        """A measured time to first token."""
        return self._observe("ttft", model, target, seconds)

    def tpot(self, model: str, target: str, seconds: float) -> bool:
        """A measured time per output token."""
        return self._observe("tpot", model, target, seconds)

    def predicted_ttft(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("predicted_ttft", model, target, seconds)

    def predicted_tpot(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("predicted_tpot", model, target, seconds)

    def ttft_prediction_duration(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("ttft_duration", model, target, seconds)

    def tpot_prediction_duration(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("tpot_duration", model, target, seconds)

    def ttft_slo(self, model: str, target: str, seconds: float, slo: float) -> bool:
        """A measured TTFT against its SLO (same unit): over it counts a ``ttft`` violation."""
        return self._slo("ttft", model, target, seconds, slo)

    def tpot_slo(self, model: str, target: str, seconds: float, slo: float) -> bool:
        return self._slo("tpot", model, target, seconds, slo)

    def _slo(self, kind: str, model: str, target: str, value: float, slo: float) -> bool:
        if value < 0:
            return False
        violated = value > slo
        if violated:
            self._f["violations"].labels(*self._plugin, model, target, kind).inc()
            self._f["old_violations"].labels(model, target, kind).inc()
        self._gauge(model, target, f"{kind}_slo_violation", 1.0 if violated else 0.0)
        return True
