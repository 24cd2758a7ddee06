"""What the producer keeps per endpoint (running requests, their TPOT SLOs, the prefill pending
there) and its prediction error statistics."""

from __future__ import annotations

import pytest

from epp.plugins.producers.predicted_latency.tracking import ErrorStats, RunningRequests


def test_running_requests_count_and_tightest_tpot_slo() -> None:
    running = RunningRequests()
    running.add("a", "r1", 50.0, now=0.0)
    running.add("a", "r2", 0.0, now=0.0)  # no SLO: does not tighten
    running.add("a", "r3", 20.0, now=0.0)
    running.add("b", "r4", 0.0, now=0.0)
    assert (running.count("a"), running.count("b"), len(running)) == (3, 1, 4)
    assert running.min_tpot_slo("a") == 20.0
    assert running.min_tpot_slo("b") == 0.0
    running.remove("r3")
    assert running.min_tpot_slo("a") == 50.0
    running.add("a", "r5", 10.0, now=0.0)
    assert running.min_tpot_slo("a") == 10.0
    running.add("b", "r1", 0.0, now=0.0)  # re-dispatched elsewhere: moved, not counted twice
    assert (running.count("a"), running.count("b")) == (2, 2)


def test_pending_prefill_until_the_first_token() -> None:
    running = RunningRequests()
    running.add("a", "r1", 0.0, now=0.0, prefill=3000)
    running.add("a", "r2", 0.0, now=0.0, prefill=500)
    assert running.pending_prefill("a") == 3500
    running.prefilled("r1")
    running.prefilled("r1")  # once only
    assert running.pending_prefill("a") == 500
    running.remove("r2")  # completed (or failed) before its first token
    assert running.pending_prefill("a") == 0 and running.count("a") == 1


def test_requests_never_completed_expire() -> None:
    running = RunningRequests()
    running.add("a", "old", 5.0, now=0.0, prefill=100)
    running.add("a", "new", 9.0, now=250.0)
    assert running.expire(now=301.0, ttl=300.0) == 1
    assert running.count("a") == 1 and running.pending_prefill("a") == 0
    assert running.min_tpot_slo("a") == 9.0
    assert running.state(10) == [{"endpoint": "a", "runningRequests": 1, "minTpotSlo": 9.0}]


def test_state_lists_the_busiest_endpoints_first() -> None:
    running = RunningRequests()
    for i, endpoint in enumerate(["x", "y", "y", "z", "z", "z"]):
        running.add(endpoint, f"r{i}", 0.0, now=0.0)
    assert [row["endpoint"] for row in running.state(2)] == ["z", "y"]


def test_error_stats() -> None:
    stats = ErrorStats(window=3)
    assert stats.state() == {"n": 0}
    for predicted, actual in [(110, 100), (80, 100), (200, 100), (100, 0)]:
        stats.add(predicted, actual)
    state = stats.state()
    assert state["n"] == 4
    assert state["maeMs"] == pytest.approx((10 + 20 + 100 + 100) / 4)
    assert state["biasMs"] == pytest.approx((10 - 20 + 100 + 100) / 4)
    assert state["mape"] == pytest.approx((0.1 + 0.2 + 1.0) / 3)  # actual 0 has no percentage
    assert state["p50AbsPctError"] == 0.2 and state["p90AbsPctError"] == 1.0
