"""``epp bench`` end to end: a short shared-prefix run through the EPP and Envoy round robin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(900)]

EPP = str(Path(sys.executable).parent / "epp")


def test_bench_writes_the_report_when_run_against_epp_and_round_robin(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [EPP, "bench", "--workloads", "a", "--targets", "epp,rr", "--requests", "20",
         "--probe", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    (workload,) = report["workloads"]
    assert workload["requests"] == 20
    assert 0 < workload["oracle"]["achievable_reuse"] < 1
    epp, rr = workload["results"]
    assert (epp["target"], rr["target"]) == ("epp", "rr")
    for r in (epp, rr):
        assert (r["status"], r["ok"], r["errors"]) == ("ok", 20, 0)
        assert sum(r["per_pod"].values()) == 20
        assert r["ttft_p50_ms"] > 0 and r["cpu_s"]
    assert epp["oracle_share"] >= rr["oracle_share"]
    assert set(epp["cpu_s"]) == {"epp", "envoy"}
    markdown = (out / "report.md").read_text()
    assert "| EPP (default config) via Envoy | 20 / 0 |" in markdown
    assert "| Envoy round robin | 20 / 0 |" in markdown


def test_the_buffered_target_routes_every_request_without_response_messages(
    tmp_path: Path,
) -> None:
    # Envoy's buffered config sends the EPP no response messages: every request still routes
    # through it and is answered, and the report names the target
    out = tmp_path / "report"
    done = subprocess.run(
        [EPP, "bench", "--workloads", "a", "--targets", "epp-buffered", "--requests", "12",
         "--probe", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (workload,) = json.loads((out / "results.json").read_text())["workloads"]
    (result,) = workload["results"]
    assert (result["target"], result["status"], result["ok"], result["errors"]) == (
        "epp-buffered", "ok", 12, 0,
    )  # fmt: skip
    assert set(result["cpu_s"]) == {"epp", "envoy"}
    markdown = (out / "report.md").read_text()
    assert "| EPP via Envoy, buffered (no response messages) | 12 / 0 |" in markdown
