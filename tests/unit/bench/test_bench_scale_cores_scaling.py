"""``epp bench scale cores``: N workers' cores computed from the 1- and 2-worker costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epp_tools.bench.scale import cores
from epp_tools.bench.scale.cores_report import cores_md

REPORT = Path(__file__).parents[3] / "docs/benchmarks/scale/cores.json"


def _group(workers: int, per_request: float, per_chunk: float) -> dict[str, object]:
    line = {"us_per_request_195k": per_request, "us_per_chunk": per_chunk}
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
