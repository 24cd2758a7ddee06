"""One short overload-shaped run through the flow-control example config: objectives from the
generated file, fairness ids, queue sampling against the config's byte caps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from epp_tools.bench.runner.run import Options, run_target
from epp_tools.bench.workloads.catalog import build

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = Path(__file__).resolve().parents[3] / "deploy" / "configs" / "flow-control.yaml"


async def test_flow_control_target_serves_every_class_and_reports_queues_when_run(
    tmp_path: Path,
) -> None:
    workload = build("d")
    picked = {"latency-sensitive": 4, "agentic": 8, "batch": 4}
    requests = []
    for r in workload.requests:  # a few of each class, sent 0.1 s apart
        if picked.get(r.objective, 0) > 0:
            picked[r.objective] -= 1
            requests.append(replace(r, at=0.1 * len(requests)))
    workload.requests, workload.measure_from = requests, 0.0
    opts = Options(workloads=["d"], targets=[], out=tmp_path, probe=0, deadline=60.0)
    result = await run_target(f"epp:{CONFIG}", workload, 0.5, opts, tmp_path / "work")
    assert (result.status, result.reason) == ("ok", "")
    assert {n: (c["sent"], c["served"]) for n, c in result.classes.items()} == {
        "latency-sensitive": (4, 4), "agentic": (8, 8), "batch": (4, 4),
    }  # fmt: skip
    tenants = result.tenants["agentic"]
    assert set(tenants) <= {"tenant-a", "tenant-b"}
    assert sum(t["served"] for t in tenants.values()) == 8
    memory = result.epp_memory
    assert memory["caps"] == {"global": 4 * 2**20, "10": 2**20, "0": 2 * 2**20, "-1": 128 * 1024}
    assert memory["queue"]["samples"] >= 1 and memory["rss_start_mb"] > 10
    objectives = (tmp_path / "work" / "objectives.yaml").read_text()
    assert "name: latency-sensitive" in objectives and "priority: -1" in objectives
