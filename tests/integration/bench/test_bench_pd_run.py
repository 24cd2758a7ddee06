"""``epp bench`` workload (e) and ``epp stack --pd`` end to end: aggregated serving against the
P/D config on a P/D fleet, few requests. When the P/D plugins do not load here the P/D run must
be reported as skipped with the reason; when they do, prefill must run on the prefill pods.

The EPP's routing changes while this instrument is used, so nothing here asserts which serving
mode is faster, only that both are measured and that the prefills went where the roles say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epp_tools.bench.workloads.catalog import build
from epp_tools.bench.workloads.spec import limit_requests
from epp_tools.stack.eppconfig import PD_CONFIG, unloadable_plugins

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(900)]

EPP = str(Path(sys.executable).parent / "epp")
REQUESTS = 10
MISSING = unloadable_plugins(PD_CONFIG.read_text())


def test_bench_e_runs_aggregated_and_pd_side_by_side_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [EPP, "bench", "--workloads", "e", "--targets", "epp,epp-pd", "--requests",
         str(REQUESTS), "--probe", "2", "--time-scale", "20", "--out", str(out)],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (workload,) = json.loads((out / "results.json").read_text())["workloads"]
    assert workload["pd_fleet"]["pod_roles"] == ["prefill", "prefill", "decode", "decode"]
    aggregated, pd = workload["results"]
    assert (aggregated["target"], aggregated["status"], aggregated["ok"]) == ("epp", "ok", REQUESTS)
    assert aggregated["remote_prefills"] == 0 and aggregated["itl_p90_ms"] > 0
    markdown = (out / "report.md").read_text()
    if MISSING:
        assert (pd["target"], pd["status"]) == ("epp-pd", "skipped")
        assert MISSING[0] in pd["reason"]
        assert f"EPP (pd) via Envoy, P/D fleet: skipped ({pd['reason']})" in markdown
        return
    assert (pd["status"], pd["ok"], pd["errors"]) == ("ok", REQUESTS, 0)
    # The config's decider (1024 uncached tokens) sends exactly the long, unique prompts to P/D.
    sent = limit_requests(build("e").requests, REQUESTS)
    long_prompts = sum(1 for r in sent if len(r.messages[0]["content"]) > 4 * 1024)
    assert pd["remote_prefills"] == long_prompts > 0
    assert pd["kv_transfer_blocks"] >= long_prompts * 500  # 8000-token prompts, 16-token blocks
    # The prefill pods served the prefill legs, the decode pods everything the client got.
    assert pd["per_pod"]["pod-0"] + pd["per_pod"]["pod-1"] == pd["remote_prefills"]
    assert pd["per_pod"]["pod-2"] + pd["per_pod"]["pod-3"] == REQUESTS
    assert "prefilled on another pod" in markdown


def test_stack_pd_prints_aggregated_and_pd_rows_when_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [EPP, "stack", "--pd", "--pods", "3", "--prefill-pods", "1", "--time-scale", "20"],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "EPP aggregated                     32      0" in done.stdout
    if MISSING:
        assert "P/D run skipped:" in done.stdout and MISSING[0] in done.stdout
        return
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("EPP P/D (1P/2D)")]
    assert row.split()[3:5] == ["32", "0"]
    assert row.endswith("100%")  # ~6900-token prompts: every one prefilled on the prefill pod
