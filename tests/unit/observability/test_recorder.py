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


def test_streamed_chunks_give_ttft_once_and_one_itl_per_later_chunk_through_one_lookup() -> None:
    m = EppMetrics()
    stats = RequestStats(m)
    m.model_labels.learn("base")
    request = make_request(incoming_model="base", target_model="base", fairness_id="t1")
    lookups: list[tuple[str, ...]] = []
    labels = m.streaming_itl.labels

    def counting(*values: str) -> object:
        lookups.append(values)
        return labels(*values)

    m.streaming_itl.labels = counting  # type: ignore[method-assign]
    for _ in range(50):
        stats.on_chunk(request, True, 0.0)
    itl = {"model_name": "base", "target_model_name": "base", "fairness_id": "t1"}
    itl["priority"] = str(request.priority)
    assert sample(m, "llm_d_epp_request_streaming_itl_seconds_count", **itl) == 49
    ttft = {"model_name": "base", "target_model_name": "base", "streaming": "true"}
    assert sample(m, "llm_d_epp_request_ttft_seconds_count", **ttft) == 1
    assert lookups == [("base", "base", "t1", str(request.priority))]
    info = ResponseInfo(request_id="req-0", headers={}, streaming=True)
    info.usage.completion_tokens = 50
    stats.on_complete(request, info, 5.0, 1000)
    tpot = "llm_d_epp_request_streaming_tpot_seconds_count"
    assert sample(m, tpot, **itl) == 1


def test_a_buffered_response_has_ttft_and_no_inter_token_latency() -> None:
    m = EppMetrics()
    stats = RequestStats(m)
    request = make_request()
    for _ in range(3):
        stats.on_chunk(request, False, 0.0)
    families = {f.name: f for f in m.registry.collect()}
    itl = [s for s in families["llm_d_epp_request_streaming_itl_seconds"].samples]
    assert itl == []
    ttft = families["llm_d_epp_request_ttft_seconds"].samples
    assert any(s.name.endswith("_count") and s.value == 1 for s in ttft)
