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
