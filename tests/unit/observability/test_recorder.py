"""RequestStats: labels from client-chosen strings are bounded, and ``running`` always returns to
zero on the series it was raised on."""

from __future__ import annotations

from epp.observability.metrics import OTHER, UNKNOWN, EppMetrics
from epp.observability.recorder import RequestStats
from epp.plugin import ProfileResult, ResponseInfo, SchedulingResult
from tests.builders import make_endpoint, make_request

RESULT = SchedulingResult({"default": ProfileResult((make_endpoint(0),))}, "default")


def sample(m: EppMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_running_is_lowered_on_the_labels_it_was_raised_on_after_a_model_is_confirmed() -> None:
    m = EppMetrics()
    stats = RequestStats(m)
    request = make_request(incoming_model="base", target_model="base")
    stats.on_scheduled(request, RESULT)  # "base" not known yet: counted as unknown
    stats.on_response_status(request, 200)  # the model server confirms it
    stats.on_complete(request, ResponseInfo(request_id="req-0", headers={}), 1.0, 10)
    running = "llm_d_epp_request_running"
    assert sample(m, running, model_name=UNKNOWN, target_model_name=UNKNOWN) == 0
    assert sample(m, running, model_name="base", target_model_name="base") is None
    duration = "llm_d_epp_request_duration_seconds_count"
    assert sample(m, duration, model_name="base", target_model_name="base") == 1


def test_fairness_ids_are_capped_at_64_and_long_ones_fold_into_other() -> None:
    m = EppMetrics()
    stats = RequestStats(m)
    for i in range(100):
        stats.on_scheduled(make_request(request_id=f"r{i}", fairness_id=f"tenant-{i}"), RESULT)
    stats.on_scheduled(make_request(fairness_id="x" * 129), RESULT)
    ids = {
        s.labels["fairness_id"]
        for family in m.registry.collect()
        if family.name == "llm_d_epp_request"
        for s in family.samples
        if s.name == "llm_d_epp_request_total"
    }
    assert len(ids) == 65 and OTHER in ids and "tenant-63" in ids and "tenant-64" not in ids
