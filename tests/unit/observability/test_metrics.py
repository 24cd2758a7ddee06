from __future__ import annotations

from epp.observability.metrics import OTHER, UNKNOWN, EppMetrics, LabelCap


def test_label_cap_folds_values_beyond_the_cap_into_other() -> None:
    cap = LabelCap(3)
    assert [cap(v) for v in ("a", "b", "c", "d", "a")] == ["a", "b", "c", OTHER, "a"]


def test_two_apps_have_separate_registries() -> None:
    a, b = EppMetrics(), EppMetrics()
    a.request_total.inc(("m", "m", "f", "0"), ("m", "m", "0"))
    assert (
        a.registry.get_sample_value(
            "llm_d_epp_request_total",
            {"model_name": "m", "target_model_name": "m", "fairness_id": "f", "priority": "0"},
        )
        == 1
    )
    assert (
        b.registry.get_sample_value(
            "llm_d_epp_request_total",
            {"model_name": "m", "target_model_name": "m", "fairness_id": "f", "priority": "0"},
        )
        is None
    )


def test_canonical_and_deprecated_twins_move_together() -> None:
    m = EppMetrics()
    m.request_total.inc(("m", "t", "f", "2"), ("m", "t", "2"))
    m.ready_endpoints.set(("pool",), ("pool",), 3)
    reg = m.registry
    assert (
        reg.get_sample_value(
            "inference_objective_request_total",
            {"model_name": "m", "target_model_name": "t", "priority": "2"},
        )
        == 1
    )
    assert reg.get_sample_value("llm_d_epp_ready_endpoints", {"name": "pool"}) == 3
    assert reg.get_sample_value("inference_pool_ready_pods", {"name": "pool"}) == 3


def test_model_labels_read_unknown_unless_the_pool_serves_the_model() -> None:
    m = EppMetrics()
    m.model_labels.add_source(lambda: ["served"])
    assert m.models("served", "client-chosen") == ("served", UNKNOWN)
    assert m.models("", "") == ("", "")
