"""``epp bench replicas`` end to end, shortened: real simulator, EPP replicas, Envoy and
``redis-server`` processes on loopback. Redis killed under load costs no request, a restarted
replica comes back, and ``--workers 2`` serves the same traffic as one process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from epp_tools.bench.replicas.cli import main

pytestmark = [
    pytest.mark.envoy,
    pytest.mark.slow,
    pytest.mark.timeout(400),  # three scenarios of real processes; a busy machine is slower
    pytest.mark.skipif(
        shutil.which("redis-server") is None,
        reason="redis-server is not installed (apt-get install redis-server; .ci/run does)",
    ),
]


def test_outage_restart_and_workers_scenarios_run(tmp_path: Path) -> None:
    code = main(
        [
            "--out", str(tmp_path), "--before", "3", "--outage", "2", "--after", "3",
            "--window", "2", "--duration", "2", "--clients", "8", "--clients-agents", "4",
        ]
    )  # fmt: skip
    assert code == 0
    report = json.loads((tmp_path / "results.json").read_text())
    outage = report["outage"]
    assert outage["requests"] > 20 and outage["failed"] == 0
    assert outage["hit_before"] > 0.5  # agent turns reuse their conversation
    assert max(outage["sync_errors"]) > 0  # each replica noticed Redis was gone
    shared, alone = report["restart"]["runs"]
    assert shared["shared"] and not alone["shared"]
    for run in (shared, alone):
        assert run["failed"] == 0 and run["restarted_prompt_tokens"] > 0
    one, two = report["workers"]["runs"]
    assert one["failed"] == two["failed"] == 0 and one["requests"] > 0 and two["requests"] > 0
    assert "## Redis killed under load" in (tmp_path / "report.md").read_text()
