"""The typed recorders of ``epp.plugin.recorders``: what a latency plugin or the DisaggregatedSet
screener writes lands in upstream's families, on the App's registry, next to the engine's."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from epp.observability.metrics import EppMetrics
from epp.plugin import TypedName
from epp.plugin.recorders import DisaggregatedSetMetrics, PredictedLatencyMetrics

PLUGIN = TypedName(type="predicted-latency-producer", name="plp")
CANON = {"plugin_name": "plp", "plugin_type": "predicted-latency-producer"}
MODEL = {"model_name": "m", "target_model_name": "t"}


def test_families_are_exposed_without_samples_before_any_plugin_records() -> None:
    text = generate_latest(EppMetrics().registry).decode()
    for family in (
        "llm_d_epp_request_predicted_ttft_seconds",
        "inference_objective_request_tpot_seconds",
        "llm_d_epp_request_slo_violation_total",
        "llm_d_epp_disaggregatedset_revision_gating_share",
    ):
        assert f"# TYPE {family} " in text
        assert f"\n{family}{{" not in text and f"\n{family}_count{{" not in text


def test_predictions_land_in_the_canonical_family_and_its_twin_with_the_last_value_gauged() -> None:
    m = EppMetrics()
    latency = PredictedLatencyMetrics(m.registry, PLUGIN)
    sample = m.registry.get_sample_value
    assert latency.predicted_ttft("m", "t", 0.2)
    assert latency.predicted_ttft("m", "t", 0.4)
    assert not latency.predicted_tpot("m", "t", -1.0)  # refused, as upstream
    assert sample("llm_d_epp_request_predicted_ttft_seconds_count", {**CANON, **MODEL}) == 2
    assert sample("inference_objective_request_predicted_ttft_seconds_sum", MODEL) == pytest.approx(
        0.6
    )
    assert sample("llm_d_epp_request_predicted_tpot_seconds_count", {**CANON, **MODEL}) is None
    gauge = "llm_d_epp_inference_request_metric"
    assert sample(gauge, {**CANON, **MODEL, "type": "predicted_ttft"}) == 0.4
    assert (
        sample("inference_objective_inference_request_metric", {**MODEL, "type": "predicted_ttft"})
        == 0.4
    )
    latency.tpot_prediction_duration("m", "t", 0.003)
    assert (
        sample(
            "llm_d_epp_request_tpot_prediction_duration_seconds_bucket",
            {**CANON, **MODEL, "le": "0.005"},
        )
        == 1
    )
    latency.ttft("m", "t", 1.5)  # observed: only the deprecated family, plus the gauge
    assert sample("inference_objective_request_ttft_seconds_count", MODEL) == 1
    assert sample(gauge, {**CANON, **MODEL, "type": "ttft"}) == 1.5


def test_slo_violations_are_counted_and_flagged_when_over_the_objective() -> None:
    registry = CollectorRegistry()
    latency = PredictedLatencyMetrics(registry, PLUGIN)
    sample = registry.get_sample_value
    latency.ttft_slo("m", "t", 0.9, slo=0.5)
    latency.ttft_slo("m", "t", 0.3, slo=0.5)
    latency.tpot_slo("m", "t", 0.01, slo=0.05)
    counter = "llm_d_epp_request_slo_violation_total"
    assert sample(counter, {**CANON, **MODEL, "type": "ttft"}) == 1
    assert sample("inference_objective_request_slo_violation_total", {**MODEL, "type": "ttft"}) == 1
    assert sample(counter, {**CANON, **MODEL, "type": "tpot"}) is None
    flag = "llm_d_epp_inference_request_metric"
    assert (
        sample(flag, {**CANON, **MODEL, "type": "ttft_slo_violation"}) == 0
    )  # the last one met it
    assert sample(flag, {**CANON, **MODEL, "type": "tpot_slo_violation"}) == 0


def test_two_instances_share_the_families_told_apart_by_plugin_name() -> None:
    registry = CollectorRegistry()
    PredictedLatencyMetrics(registry, PLUGIN).predicted_ttft("m", "t", 0.1)
    PredictedLatencyMetrics(registry, TypedName(PLUGIN.type, "other")).predicted_ttft("m", "t", 0.1)
    count = "llm_d_epp_request_predicted_ttft_seconds_count"
    assert registry.get_sample_value(count, {**CANON, "plugin_name": "other", **MODEL}) == 1
    assert (
        registry.get_sample_value("inference_objective_request_predicted_ttft_seconds_count", MODEL)
        == 2
    )


def test_revision_shares_follow_the_observed_revisions_and_strict_misses_are_counted() -> None:
    m = EppMetrics()
    screener = TypedName(type="disaggregatedset-rollout-screener", name="rollout")
    dset = DisaggregatedSetMetrics(m.registry, screener)
    sample = m.registry.get_sample_value
    share = "llm_d_epp_disaggregatedset_revision_gating_share"
    labels = {"plugin_type": screener.type, "plugin_name": "rollout", "mode": "weighted"}
    dset.revision_shares("weighted", {"rev-a": 0.75, "rev-b": 0.25})
    assert sample(share, {**labels, "revision": "rev-a"}) == 0.75
    dset.revision_shares("weighted", {"rev-b": 1.0})  # rev-a's pods are gone
    assert sample(share, {**labels, "revision": "rev-a"}) is None
    assert sample(share, {**labels, "revision": "rev-b"}) == 1.0
    dset.strict_header_no_match("x-revision")
    no_match = "llm_d_epp_disaggregatedset_strict_header_no_match_total"
    assert (
        sample(
            no_match,
            {"plugin_type": screener.type, "plugin_name": "rollout", "selector": "x-revision"},
        )
        == 1
    )
