"""Typed metric recorders for plugin types whose families the EPP declares at start-up.

Upstream dashboards key on these families whether or not the plugin that feeds them is
configured, so the engine registers them on every App's registry (``EppMetrics``), where they
expose no samples until a plugin records. A plugin builds its recorder from its handle; the
families are looked up by name (``metric_family``), so any number of instances share them::

    latency = PredictedLatencyMetrics(handle.registry, self.typed_name)
    latency.predicted_ttft("llama", "llama", 0.120)

``PredictedLatencyMetrics`` (fed by ``predicted-latency-producer`` and the latency plugins when
configured), each canonical family with its deprecated ``inference_objective_*`` twin, which has
no ``plugin_*`` labels:

- ``llm_d_epp_request_predicted_ttft_seconds`` / ``..._predicted_tpot_seconds`` (histograms);
- ``llm_d_epp_request_ttft_prediction_duration_seconds`` / ``..._tpot_prediction_duration_seconds``
  (histograms: time spent computing a prediction);
- ``llm_d_epp_request_slo_violation_total{type}`` (``ttft`` or ``tpot``);
- ``llm_d_epp_inference_request_metric{type}``: the last value of each kind (``ttft``, ``tpot``,
  ``predicted_ttft``, ``predicted_tpot``, ``ttft_prediction_duration``,
  ``tpot_prediction_duration``, and ``ttft_slo_violation`` / ``tpot_slo_violation`` as 0 or 1);
- ``inference_objective_request_ttft_seconds`` / ``inference_objective_request_tpot_seconds``:
  observed TTFT and TPOT as the latency plugins see them (no canonical twin here: the engine's
  ``llm_d_epp_request_ttft_seconds`` and ``..._streaming_tpot_seconds`` measure every request).

``DisaggregatedSetMetrics`` (fed by ``disaggregatedset-rollout-screener`` when configured):

- ``llm_d_epp_disaggregatedset_strict_header_no_match_total{plugin_type, plugin_name, selector}``:
  strict header selections that matched no endpoint and failed closed;
- ``llm_d_epp_disaggregatedset_revision_gating_share{plugin_type, plugin_name, mode, revision}``:
  each revision's weighted share from 0 to 1; a revision that leaves the observed pods loses its
  series.

Names, labels and buckets are upstream's; a negative value is not recorded (the call returns
``False``), as upstream's recorders refuse it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.plugin.metrics import metric_family
from epp.plugin.types import TypedName

_MODEL: Final = ("model_name", "target_model_name")
_PLUGIN_MODEL: Final = ("plugin_name", "plugin_type", *_MODEL)
# fmt: off
_LATENCY_BUCKETS: Final = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)
_TPOT_BUCKETS: Final = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.6, 0.8, 1, 1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)
_PREDICTION_BUCKETS: Final = (
    0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)
# fmt: on

# key → (kind, canonical name or None, twin name, help, buckets, with a ``type`` label)
_LATENCY_FAMILIES: Final[
    dict[str, tuple[type[Any], str | None, str, str, tuple[float, ...] | None, bool]]
] = {
    "metric": (
        Gauge,
        "llm_d_epp_inference_request_metric",
        "inference_objective_inference_request_metric",
        "Consolidated gauge for various inference request metrics including TTFT, TPOT, SLOs, "
        "and prediction durations.",
        None,
        True,
    ),
    "ttft": (
        Histogram,
        None,
        "inference_objective_request_ttft_seconds",
        "Inference model TTFT distribution in seconds for each model and target model.",
        _LATENCY_BUCKETS,
        False,
    ),
    "predicted_ttft": (
        Histogram,
        "llm_d_epp_request_predicted_ttft_seconds",
        "inference_objective_request_predicted_ttft_seconds",
        "Inference model Predicted TTFT distribution in seconds for each model and target model.",
        _LATENCY_BUCKETS,
        False,
    ),
    "ttft_prediction_duration": (
        Histogram,
        "llm_d_epp_request_ttft_prediction_duration_seconds",
        "inference_objective_request_ttft_prediction_duration_seconds",
        "Duration taken to generate TTFT predictions in seconds for each model and target model.",
        _PREDICTION_BUCKETS,
        False,
    ),
    "tpot": (
        Histogram,
        None,
        "inference_objective_request_tpot_seconds",
        "Inference model TPOT distribution in seconds for each model and target model.",
        _TPOT_BUCKETS,
        False,
    ),
    "predicted_tpot": (
        Histogram,
        "llm_d_epp_request_predicted_tpot_seconds",
        "inference_objective_request_predicted_tpot_seconds",
        "Inference model Predicted TPOT distribution in seconds for each model and target model.",
        _TPOT_BUCKETS,
        False,
    ),
    "tpot_prediction_duration": (
        Histogram,
        "llm_d_epp_request_tpot_prediction_duration_seconds",
        "inference_objective_request_tpot_prediction_duration_seconds",
        "Duration taken to generate TPOT predictions in seconds for each model and target model.",
        _PREDICTION_BUCKETS,
        False,
    ),
    "slo_violation": (
        Counter,
        "llm_d_epp_request_slo_violation",
        "inference_objective_request_slo_violation",
        "Counter of SLO violations for each model, target model, and violation type.",
        None,
        True,
    ),
}


def _latency_families(registry: CollectorRegistry) -> dict[str, tuple[Any, Any]]:
    """key → (canonical family or ``None``, twin family), created on first use."""
    out: dict[str, tuple[Any, Any]] = {}
    for key, (kind, name, twin, doc, buckets, typed) in _LATENCY_FAMILIES.items():
        extra = ("type",) if typed else ()
        kw = {} if buckets is None else {"buckets": buckets}
        canonical = (
            None
            if name is None
            else metric_family(registry, kind, name, doc, (*_PLUGIN_MODEL, *extra), **kw)
        )
        suffix = "_total" if kind is Counter else ""
        deprecated_doc = f"Deprecated: {name}{suffix}" if name else doc
        out[key] = (
            canonical,
            metric_family(registry, kind, twin, deprecated_doc, (*_MODEL, *extra), **kw),
        )
    return out


class PredictedLatencyMetrics:
    """What a latency plugin records, under its ``plugin_name`` and ``plugin_type``."""

    def __init__(self, registry: CollectorRegistry, plugin: TypedName) -> None:
        self._plugin = (plugin.name, plugin.type)
        self._families = _latency_families(registry)

    @staticmethod
    def declare(registry: CollectorRegistry) -> None:
        """Register the families on ``registry`` (the engine does, for every App)."""
        _latency_families(registry)

    def _gauge(self, model: str, target: str, kind: str, value: float) -> None:
        canonical, twin = self._families["metric"]
        canonical.labels(*self._plugin, model, target, kind).set(value)
        twin.labels(model, target, kind).set(value)

    def _observe(self, key: str, model: str, target: str, value: float) -> bool:
        if value < 0:
            return False
        canonical, twin = self._families[key]
        if canonical is not None:
            canonical.labels(*self._plugin, model, target).observe(value)
        twin.labels(model, target).observe(value)
        self._gauge(model, target, key, value)
        return True

    def ttft(self, model: str, target: str, seconds: float) -> bool:
        """An observed time to first token."""
        return self._observe("ttft", model, target, seconds)

    def tpot(self, model: str, target: str, seconds: float) -> bool:
        """An observed time per output token."""
        return self._observe("tpot", model, target, seconds)

    def predicted_ttft(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("predicted_ttft", model, target, seconds)

    def predicted_tpot(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("predicted_tpot", model, target, seconds)

    def ttft_prediction_duration(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("ttft_prediction_duration", model, target, seconds)

    def tpot_prediction_duration(self, model: str, target: str, seconds: float) -> bool:
        return self._observe("tpot_prediction_duration", model, target, seconds)

    def ttft_slo(self, model: str, target: str, seconds: float, slo: float) -> bool:
        """An observed TTFT against its SLO: over it counts a ``ttft`` violation."""
        return self._slo("ttft", model, target, seconds, slo)

    def tpot_slo(self, model: str, target: str, seconds: float, slo: float) -> bool:
        """An observed TPOT against its SLO: over it counts a ``tpot`` violation."""
        return self._slo("tpot", model, target, seconds, slo)

    def _slo(self, kind: str, model: str, target: str, value: float, slo: float) -> bool:
        if value < 0:
            return False
        violated = value > slo
        self._gauge(model, target, f"{kind}_slo_violation", 1.0 if violated else 0.0)
        if violated:
            canonical, twin = self._families["slo_violation"]
            canonical.labels(*self._plugin, model, target, kind).inc()
            twin.labels(model, target, kind).inc()
        return True


_DSET_NO_MATCH: Final = (
    "llm_d_epp_disaggregatedset_strict_header_no_match",
    "Strict header selections that matched no endpoint and failed closed.",
    ("plugin_type", "plugin_name", "selector"),
)
_DSET_SHARE: Final = (
    "llm_d_epp_disaggregatedset_revision_gating_share",
    "Current weighted revision gating share from 0 to 1; incomplete revisions have share 0.",
    ("plugin_type", "plugin_name", "mode", "revision"),
)


class DisaggregatedSetMetrics:
    """What ``disaggregatedset-rollout-screener`` records, under its name and type."""

    def __init__(self, registry: CollectorRegistry, plugin: TypedName) -> None:
        self._plugin = (plugin.type, plugin.name)
        self._no_match, self._share = self._families(registry)
        self._revisions: dict[str, frozenset[str]] = {}

    @staticmethod
    def _families(registry: CollectorRegistry) -> tuple[Any, Any]:
        return (
            metric_family(registry, Counter, *_DSET_NO_MATCH),
            metric_family(registry, Gauge, *_DSET_SHARE),
        )

    @classmethod
    def declare(cls, registry: CollectorRegistry) -> None:
        """Register the families on ``registry`` (the engine does, for every App)."""
        cls._families(registry)

    def strict_header_no_match(self, selector: str) -> None:
        self._no_match.labels(*self._plugin, selector).inc()

    def revision_shares(self, mode: str, shares: Mapping[str, float]) -> None:
        """The current share of each revision under ``mode``; revisions missing from ``shares``
        that an earlier call reported lose their series."""
        for gone in self._revisions.get(mode, frozenset()) - shares.keys():
            self._share.remove(*self._plugin, mode, gone)
        for revision, share in shares.items():
            self._share.labels(*self._plugin, mode, revision).set(share)
        self._revisions[mode] = frozenset(shares)
