"""``epp bench scale cores``: N workers' cores computed from the 1- and 2-worker costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epp_tools.bench.scale import cores
from epp_tools.bench.scale.cores_report import cores_md
from epp_tools.bench.workloads import long

REPORT = Path(__file__).parents[3] / "docs/benchmarks/scale/cores.json"


def _group(
    workers: int, per_request: float, per_chunk: float, per_turn: float | None = None
) -> dict[str, object]:
    line = {"us_per_request_195k": per_request, "us_per_chunk": per_chunk}
    if per_turn is not None:
        line["us_per_request_turn"] = per_turn
    return {"workers": workers, "status": "ok", "computed": line}


def test_each_further_worker_adds_what_the_second_added_to_a_request() -> None:
    sc = cores.scaling([_group(1, 8_000.0, 6.0), _group(2, 9_000.0, 5.0)])
    assert sc["us_added_per_worker"] == 1_000.0
    rows = {r["workers"]: r for r in sc["rows"]}
    assert rows[1]["us_per_request_195k"] == 8_000.0 and rows[8]["us_per_request_195k"] == 15_000.0
    chunks = cores.SEED_CHUNKS_PER_S * 6.0 / 1e6  # the 1-worker chunk cost, whatever N
    assert rows[4]["cores"] == pytest.approx(cores.SEED_REQUESTS_PER_S * 0.011 + chunks, abs=0.01)


def test_a_cheaper_second_worker_adds_nothing_and_one_group_computes_nothing() -> None:
    sc = cores.scaling([_group(1, 8_000.0, 6.0), _group(2, 7_500.0, 6.0)])
    assert sc["us_added_per_worker"] == 0.0
    assert len({r["cores"] for r in sc["rows"]}) == 1
    assert cores.scaling([_group(1, 8_000.0, 6.0)]) == {}


def test_the_report_shows_the_table_for_the_stored_run() -> None:
    report = json.loads(REPORT.read_text())
    report["scaling"] = cores.scaling(report["groups"])
    text = cores_md(report)
    assert "| workers | µs per 195,000-token request | cores at the peak |" in text
    assert "| 8 |" in text
    assert "With N workers" not in cores_md({**report, "scaling": {}})


def test_agents_turns_scale_from_their_own_costs_when_both_groups_measured_them() -> None:
    sc = cores.scaling([_group(1, 8_000.0, 6.0, 7_000.0), _group(2, 9_000.0, 5.0, 7_200.0)])
    assert sc["us_added_per_worker"] == 1_000.0 and sc["us_added_per_worker_turn"] == 200.0
    rows = {r["workers"]: r for r in sc["rows"]}
    assert rows[8]["us_per_request_turn"] == 8_400.0 and rows[8]["us_per_request_195k"] == 15_000.0
    chunks = cores.SEED_CHUNKS_PER_S * 6.0 / 1e6
    assert rows[1]["cores_turns"] == pytest.approx(cores.SEED_REQUESTS_PER_S * 0.007 + chunks, 0.01)
    # a group without the turns (an older report) scales the fresh prompts alone
    old = cores.scaling([_group(1, 8_000.0, 6.0, 7_000.0), _group(2, 9_000.0, 5.0)])
    assert "us_added_per_worker_turn" not in old and "cores_turns" not in old["rows"][0]


def test_turns_share_the_context_and_differ_in_their_tails() -> None:
    a = [json.loads(b) for b in long.turn_bodies(3, 5_000, 1, run=0)]
    b = [json.loads(b) for b in long.turn_bodies(2, 5_000, 1, run=1)]
    contexts = {body["messages"][0]["content"] for body in a + b}
    tails = [body["messages"][-1]["content"] for body in a + b]
    assert len(contexts) == 1 and len(set(tails)) == 5
    assert len(next(iter(contexts))) == 4 * (5_000 - long.TURN_TAIL_TOKENS)  # 4 bytes a word


def test_the_report_shows_the_turns_where_measured() -> None:
    report = json.loads(REPORT.read_text())
    turns = {"tokens": 195_000, "tail_tokens": 1_300, "rate": 6.0, "low_rate": 2.0,
             "answered": 160, "errors": 0, "us_per_request": 5_000.0}  # fmt: skip
    for i, group in enumerate(report["groups"]):
        group["turns"] = {**turns, "us_per_request": 5_000.0 + 300.0 * i}
        group["computed"] = cores.computed(group)
    report["scaling"] = cores.scaling(report["groups"])
    text = cores_md(report)
    assert "195,000-token agent turns (all but the last 1,300 tokens shared" in text
    assert "with agents' turns instead of fresh prompts (5,000 µs each)" in text
    assert "a second worker added 300 µs to each turn" in text
    assert "| 8 | 7,100 |" in text


def test_the_second_workers_own_cpu_is_what_each_further_worker_adds_when_measured() -> None:
    two = _group(2, 9_000.0, 5.0, 7_200.0)
    two["computed"].update(us_applied_195k=1_500.0, us_applied_turn=300.0)  # type: ignore[attr-defined]
    sc = cores.scaling([_group(1, 8_000.0, 6.0, 7_000.0), two])
    assert sc["us_applied_per_worker"] == 1_500.0 and sc["us_applied_per_worker_turn"] == 300.0
    assert sc["us_added_per_worker"] == 1_000.0  # the difference of the totals, kept
    rows = {r["workers"]: r for r in sc["rows"]}
    assert rows[3]["us_per_request_195k"] == 11_000.0 and rows[3]["us_per_request_turn"] == 7_600.0
    text = cores_md({"seed": {"chunks_per_s": 1.0, "go_us_per_chunk": 1.0}, "scaling": sc,
                     "groups": [], "started": ""})  # fmt: skip
    assert "applying the other worker's facts cost each worker 1,500 µs per request" in text


def test_the_applying_cost_is_the_epps_own_timing_else_the_least_busy_workers_slope() -> None:
    big = {"us_per_request": 9_000.0, "us_per_request_by_worker": [8_700.0, 420.0],
           "us_applied_per_request": 380.0}  # fmt: skip
    turns = {"us_per_request": 8_000.0, "us_per_request_by_worker": [7_800.0, 250.0]}
    group = {"steps": [{"rate": 100.0, "reached": True, "us_per_chunk": 6.0}], "big": big,
             "turns": turns}  # fmt: skip
    line = cores.computed(group)
    assert line["us_applied_195k"] == 380.0 and line["us_applied_turn"] == 250.0
    one = {"steps": group["steps"], "big": {"us_per_request": 8_000.0}}
    assert "us_applied_195k" not in cores.computed(one)


def test_each_worker_gets_its_own_slope_the_supervisor_left_out() -> None:
    group = cores._Group(eset=None, pid=1)  # type: ignore[arg-type]
    runs = [(True, 10, {1: 0.01, 2: 0.10, 3: 0.002}), (False, 30, {1: 0.02, 2: 0.30, 3: 0.006})]
    assert cores._by_process(group, runs) == {"us_per_request_by_worker": [10_000.0, 200.0]}
    assert cores._by_process(group, [(True, 10, {1: 0.01, 2: 0.1})]) == {}  # one worker


def test_apply_seconds_sums_every_worker_and_plugin_of_a_metrics_page() -> None:
    page = (
        "# HELP llm_d_epp_state_sync_apply_seconds_total Seconds spent applying\n"
        'llm_d_epp_state_sync_apply_seconds_total{plugin_name="a",worker="0"} 0.25\n'
        'llm_d_epp_state_sync_apply_seconds_total{plugin_name="b",worker="1"} 0.5\n'
        'llm_d_epp_state_sync_apply_seconds_created{plugin_name="a",worker="0"} 1.7e9\n'
        'llm_d_epp_state_sync_applied_facts_total{plugin_name="a",worker="0"} 9.0\n'
    )
    assert cores.apply_seconds(page) == 0.75
    assert cores.apply_seconds("") == 0.0
    assert cores.apply_seconds_by_plugin(page) == {"a": 0.25, "b": 0.5}


def test_a_periodic_applying_cost_is_left_out_of_the_slope_but_not_the_mean() -> None:
    # Each run lasts as long: the in-flight producer's refreshes cost 2 ms a run whatever the
    # rate, while the prefix index's facts cost 300 us per request.
    runs = [(True, 10), (False, 30), (True, 10), (False, 30)]
    applied = [{"inflight": 0.0, "prefix": 0.0}]
    for _, n in runs:
        last = applied[-1]
        applied.append({"inflight": last["inflight"] + 0.002, "prefix": last["prefix"] + n * 3e-4})
    out = cores._applying(applied, runs)
    assert out["us_applied_by_plugin"] == {"inflight": 100.0, "prefix": 300.0}  # 8 ms / 80
    assert out["us_applied_slope_by_plugin"] == {"inflight": 0.0, "prefix": 300.0}
    assert out["us_applied_per_request"] == 400.0 and out["us_applied_slope"] == 300.0


def test_the_computed_line_takes_the_applying_slope_when_there_is_one() -> None:
    big = {"us_per_request": 9_000.0, "us_per_request_by_worker": [8_700.0, 420.0],
           "us_applied_per_request": 380.0, "us_applied_slope": 310.0}  # fmt: skip
    group = {"steps": [{"rate": 100.0, "reached": True, "us_per_chunk": 6.0}], "big": big}
    assert cores.computed(group)["us_applied_195k"] == 310.0
