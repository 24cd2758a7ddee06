"""The explain log keeps client-chosen strings short, so its size is bounded by its capacity."""

from __future__ import annotations

from epp.observability.decisions import MAX_FIELD_CHARS, DecisionLog, loggable
from tests.builders import make_request


def test_long_client_strings_are_clipped_and_the_entry_is_still_found() -> None:
    log = DecisionLog(capacity=2)
    long_id = "r" * 10_000
    request = make_request(
        request_id=long_id,
        incoming_model="m" * 1_000_000,
        fairness_id="f" * 5000,
        objective="o" * 5000,
    )
    log.record_error(request, 400, "e" * 100_000, None)
    entry = log.get(long_id)
    assert entry is not None
    for key in ("requestId", "model", "fairnessId", "objective", "error"):
        assert len(entry[key]) == MAX_FIELD_CHARS and entry[key].endswith("…")
    for i in range(5):
        log.record_error(make_request(request_id=f"r{i}"), 400, "bad", None)
    assert [e["requestId"] for e in log.latest(10)] == ["r4", "r3"]


def test_loggable_escapes_control_characters_and_clips_when_client_strings_are_hostile() -> None:
    forged = "abc\n2026-01-01 INFO forged line\x1b[31m"
    out = loggable(forged)
    assert "\n" not in out and "\x1b" not in out
    assert out == "abc\\n2026-01-01 INFO forged line\\x1b[31m"
    assert len(loggable("r" * 100_000)) == 128
    assert loggable(None) == "None"


def test_the_top_candidates_are_ranked_as_a_stable_sort_would_rank_them() -> None:
    from epp.observability.decisions import decision_entry
    from epp.plugin import ProfileResult, SchedulingResult
    from tests.builders import make_endpoint, make_request

    eps = [make_endpoint(i) for i in range(40)]
    totals = {e.id: float((i * 7) % 5) for i, e in enumerate(eps)}  # many ties
    result = SchedulingResult({"default": ProfileResult((eps[3],), scores=totals)}, "default")
    entry = decision_entry(make_request(), result, eps, 0.001, top=6)
    ranked = sorted(totals.items(), key=lambda kv: kv[1], reverse=True)[:6]
    got = [(s["id"], s["total"]) for s in entry["profiles"]["default"]["scores"]]
    assert got == ranked
    assert [s["endpoint"] for s in entry["profiles"]["default"]["scores"]] == [
        next(e.hostport for e in eps if e.id == eid) for eid, _ in ranked
    ]


def test_a_scheduled_entry_written_on_read_is_the_entry_of_the_decision() -> None:
    from epp.observability.decisions import EXPLAIN_KEY, decision_entry
    from epp.plugin import ProfileResult, SchedulingResult
    from tests.builders import make_endpoint

    eps = [make_endpoint(i) for i in range(30)]
    totals = {e.id: i / 30 for i, e in enumerate(eps)}
    result = SchedulingResult({"default": ProfileResult((eps[29],), scores=totals)}, "default")
    request = make_request(request_id="r1")
    request.attributes[EXPLAIN_KEY] = {eps[29].id: {"s/a": 1.0}}
    log = DecisionLog(capacity=4)
    log.record(request, result, eps, 0.002)
    want = decision_entry(request, result, eps, 0.002)
    got = log.get("r1")
    assert got is not None
    assert {**got, "time": 0} == {**want, "time": 0}
    assert got["profiles"]["default"]["scores"][0]["scorers"] == {"s/a": 1.0}
    assert log.get("r1") is got  # written once
    log.record_error(make_request(request_id="r2"), 400, "bad", None)
    assert [e["requestId"] for e in log.latest(10)] == ["r2", "r1"]
    assert [e["requestId"] for e in log.latest(0)] == ["r2", "r1"]  # limit <= 0: all, as before
