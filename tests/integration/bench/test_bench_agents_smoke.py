"""``epp bench`` end to end on the agent workloads (b, b-foreign, b-pressure) through the EPP and
Envoy round robin, few requests each: the session columns are measured and reported.

The EPP's routing changes while this instrument is used, so nothing here asserts how well a
target routes, only that every statistic is measured, within its range and consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# six bench runs of real processes: minutes on a busy machine
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(960)]

EPP = str(Path(sys.executable).parent / "epp")
REQUESTS = 24


def _check_sessions(r: dict[str, Any]) -> None:
    assert (r["status"], r["ok"], r["errors"]) == ("ok", REQUESTS, 0)
    assert 0.0 <= r["colocation"] <= 1.0 and r["colocation_pairs"] > 0


def _check_b(w: dict[str, Any]) -> None:
    for r in w["results"]:
        _check_sessions(r)
        assert r["followups"] > 0 and 0.0 <= r["followup_success"] <= 1.0
        assert r["followups_ok"] + r["followups_404"] == r["followups"]
        assert r["busy_pod_share"] is None


def _check_foreign(w: dict[str, Any]) -> None:
    assert w["foreign_load"]["pod"] == 0 and w["fleet"]["max_num_seqs"] == 8
    for r in w["results"]:
        _check_sessions(r)
        assert r["busy_pod"] == "pod-0" and 0.0 <= r["busy_pod_share"] <= 1.0
        assert r["others_imbalance"] >= 1.0
        assert sum(r["per_pod"].values()) == REQUESTS + r["followups_404"]
        foreign = r["foreign_load"]
        assert foreign["served"] > 0 and foreign["samples"] > 0
        # the batch was full on average and a queue formed; how deep it stays on average depends
        # on how fast a loaded machine replaces each finished foreign request (3.5 seen, not 10)
        assert foreign["mean_running"] >= 6 and foreign["max_waiting"] >= 5
        assert foreign["mean_waiting"] > 0


def _check_pressure(w: dict[str, Any]) -> None:
    kv = w["fleet"]["pod_kv_tokens"]
    assert kv[0] < min(kv[1:]) and w["shape"]["hot_set_tokens"] > 0
    for r in w["results"]:
        _check_sessions(r)
        assert r["followup_success"] is None and r["busy_pod_share"] is None
        assert 0.0 < r["oracle_share"] <= 1.0 + 1e-9


def test_bench_reports_session_columns_when_agent_workloads_run(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [EPP, "bench", "--workloads", "b,b-foreign,b-pressure", "--targets", "epp,rr",
         "--requests", str(REQUESTS), "--probe", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    b, foreign, pressure = report["workloads"]
    assert (b["name"], foreign["name"], pressure["name"]) == ("b", "b-foreign", "b-pressure")
    for w in report["workloads"]:
        assert [r["target"] for r in w["results"]] == ["epp", "rr"]
    _check_b(b)
    _check_foreign(foreign)
    _check_pressure(pressure)
    markdown = (out / "report.md").read_text()
    assert "| % of oracle | colocation | follow-up ok | TTFT p50 |" in markdown
    assert "| colocation | follow-up ok | busy-pod share | others imbalance |" in markdown
    assert "Foreign load during each run:" in markdown
    assert "colocation" in done.stdout and "to busy pod-0" in done.stdout
