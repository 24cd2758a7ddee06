"""Session statistics (colocation, follow-ups, foreign-load avoidance) on hand-made outcomes with
known answers, and how the report shows them."""

from __future__ import annotations

from typing import Any

import pytest

from epp_tools.bench.runner.driver import Outcome
from epp_tools.bench.runner.foreign import _Window, window_stats
from epp_tools.bench.runner.report import render_workload, session_columns
from epp_tools.bench.runner.results import TargetResult
from epp_tools.bench.runner.sessions import (
    add_foreign_stats,
    add_session_stats,
    avoidance,
    colocation,
    followups,
    routed_per_pod,
)
from epp_tools.bench.workloads.spec import ForeignLoad


def _o(session: str, turn: int, pod: str, *, status: int = 200, **kw: Any) -> Outcome:
    tokens = 5 if status == 200 else 0
    return Outcome(0, session, "", status, pod=pod, turn=turn, tokens=tokens, **kw)


def test_colocation_counts_served_turn_pairs_on_one_pod_when_sessions_ran() -> None:
    outcomes = [
        # s1: 0->1 same, 1->2 moved, 2->3 same  (3 pairs, 2 same)
        _o("s1", 0, "a"), _o("s1", 1, "a"), _o("s1", 2, "b"), _o("s1", 3, "b"),
        # s2 out of order in the list: 0->1 same (1 pair)
        _o("s2", 1, "c"), _o("s2", 0, "c"),
        # s3: the failed middle turn takes both of its pairs out
        _o("s3", 0, "a"), _o("s3", 1, "a", status=503), _o("s3", 2, "a"),
        # single-turn sessions have no pairs
        _o("one", 0, "d"),
    ]  # fmt: skip
    share, pairs = colocation(outcomes)
    assert pairs == 4
    assert share == pytest.approx(3 / 4)


def test_colocation_is_none_when_no_session_has_two_served_turns() -> None:
    assert colocation([_o("x", 0, "a"), _o("y", 0, "b")]) == (None, 0)


def test_followups_count_200_and_404_over_follow_ups_only_when_summarized() -> None:
    outcomes = [
        _o("r", 0, "a"),  # a first turn: not a follow-up
        _o("r", 1, "a", followup_status=200),
        _o("r", 2, "b", followup_status=404, lost_pod="c"),
        _o("r", 3, "b", followup_status=200),
        _o("r", 4, "", status=0, followup_status=503),
    ]
    stats = followups(outcomes)
    assert stats == {
        "followups": 4,
        "followups_ok": 2,
        "followups_404": 1,
        "followup_success": 0.5,
    }
    assert followups([_o("c", 1, "a")])["followup_success"] is None


def test_routed_per_pod_counts_the_refusing_pod_of_a_lost_follow_up() -> None:
    outcomes = [
        _o("s", 0, "pod-1"),
        _o("s", 1, "pod-2", followup_status=404, lost_pod="pod-0"),
        _o("s", 2, "", status=0),  # never reached a pod
    ]
    assert routed_per_pod(outcomes, ["pod-0", "pod-1", "pod-2", "pod-3"]) == {
        "pod-0": 1, "pod-1": 1, "pod-2": 1, "pod-3": 0,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("per_pod", "share", "others"),
    [
        pytest.param({"p0": 2, "p1": 6, "p2": 6, "p3": 6}, 0.1, 1.0, id="avoided-even"),
        pytest.param({"p0": 10, "p1": 10, "p2": 10, "p3": 10}, 0.25, 1.0, id="ignored"),
        pytest.param({"p0": 0, "p1": 12, "p2": 6, "p3": 0}, 0.0, 2.0, id="avoided-skewed"),
        pytest.param({"p0": 0, "p1": 0}, 0.0, 0.0, id="nothing-sent"),
    ],
)
def test_avoidance_gives_busy_share_and_imbalance_of_the_others(
    per_pod: dict[str, int], share: float, others: float
) -> None:
    stats = avoidance(per_pod, "p0")
    assert stats["busy_pod_share"] == pytest.approx(share)
    assert stats["others_imbalance"] == pytest.approx(others)


def test_foreign_stats_take_load_and_hit_ratio_from_the_target_answers() -> None:
    result = TargetResult("rr", "RR", hit_ratio=0.3, client_hit_ratio=0.6, oracle_share=0.4)
    outcomes = [_o("s", i, f"pod-{i % 3}") for i in range(6)]  # pod-0..2 twice each, pod-3 none
    add_foreign_stats(result, outcomes, ["pod-0", "pod-1", "pod-2", "pod-3"], "pod-0",
                      {"mean_waiting": 9.5}, oracle_ratio=0.8)  # fmt: skip
    assert result.per_pod == {"pod-0": 2, "pod-1": 2, "pod-2": 2, "pod-3": 0}
    assert result.busy_pod == "pod-0"
    assert result.busy_pod_share == pytest.approx(2 / 6)
    assert result.others_imbalance == pytest.approx(2 / (4 / 3))
    assert result.imbalance == pytest.approx(2 / 1.5)
    assert (result.hit_ratio, result.oracle_share) == (0.6, pytest.approx(0.75))
    assert result.foreign_load == {"mean_waiting": 9.5}


def test_session_stats_fill_the_result_when_added() -> None:
    result = TargetResult("epp", "EPP")
    add_session_stats(result, [_o("r", 0, "a"), _o("r", 1, "a", followup_status=200)])
    assert (result.colocation, result.colocation_pairs) == (1.0, 1)
    assert (result.followups, result.followups_ok, result.followup_success) == (1, 1, 1.0)


def test_foreign_window_reports_mean_and_max_waiting_when_sampled() -> None:
    window = _Window(sent=12, served=10, failed=1, waiting=[9, 10, 11, 12], running=[8, 8, 8, 8])
    stats = window_stats(window, ForeignLoad(), workers=18)
    assert (stats["mean_waiting"], stats["max_waiting"], stats["mean_running"]) == (10.5, 12, 8.0)
    assert (stats["sent"], stats["served"], stats["failed"], stats["samples"]) == (12, 10, 1, 4)
    assert (stats["pod"], stats["waiting"], stats["in_flight"]) == (0, 10, 18)


def _workload(results: list[dict[str, Any]], name: str = "b") -> dict[str, Any]:
    return {
        "name": name, "title": "t", "description": "d", "requests": 4, "concurrency": 2,
        "fleet": {"pods": 2, "kv_tokens_per_pod": 100, "pod_kv_tokens": [40, 100],
                  "time_scale": 1.0},
        "shape": {}, "oracle": {"achievable_reuse": 0.5}, "results": results,
    }  # fmt: skip


def _result(**fields: Any) -> dict[str, Any]:
    r = TargetResult("epp", "EPP", ok=4, requests=4, **fields)
    return r.as_json()


def test_report_adds_session_columns_beside_the_hit_ratio_only_where_they_apply() -> None:
    plain = _result()
    assert session_columns([plain]) == []
    lines = render_workload(_workload([plain], "a"))
    assert "colocation" not in "\n".join(lines)
    agent = _result(colocation=0.75, followup_success=0.5, followups=8)
    lines = render_workload(_workload([agent]))
    head = next(line for line in lines if line.startswith("| target"))
    cells = [c.strip() for c in head.strip("|").split("|")]
    assert cells[2:6] == ["hit", "% of oracle", "colocation", "follow-up ok"]
    row = next(line for line in lines if line.startswith("| EPP"))
    assert [c.strip() for c in row.strip("|").split("|")][4:6] == ["75.0%", "50.0% of 8"]
    assert "fleet 2 pods with 40 / 100 KV tokens" in "\n".join(lines)


def test_report_shows_the_foreign_columns_and_the_busy_pod_queue_when_measured() -> None:
    foreign = {"mean_waiting": 10.2, "max_waiting": 13, "mean_running": 8.0, "served": 40,
               "failed": 0}  # fmt: skip
    r = _result(colocation=1.0, busy_pod="pod-0", busy_pod_share=0.05, others_imbalance=1.2,
                foreign_load=foreign)  # fmt: skip
    text = "\n".join(render_workload(_workload([r], "b-foreign")))
    assert "| colocation | busy-pod share | others imbalance |" in text
    assert "| 100.0% | 5.0% | 1.20 |" in text
    assert "pod-0 had 10.2 requests waiting on average (max 13) and 8.0 running" in text
