"""``epp bench rate`` end to end: one short, low rate through Envoy for each ext_proc server.

The rate is low enough for a busy 2-core machine; nothing here asserts a latency, only that
every request was answered, that the EPP's own histogram counted one pick per request and that
the report carries the figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(150)]

EPP = str(Path(sys.executable).parent / "epp")


def test_bench_rate_measures_picks_per_server_when_run_at_a_low_rate(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run(
        [EPP, "bench", "rate", "--rates", "20", "--duration", "1", "--pods", "2", "--idle", "0",
         "--max-tokens", "5", "--out", str(out)],
        capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "results.json").read_text())
    assert report["run"]["config"].endswith("deploy/configs/upstream-default.yaml")
    assert [s["server"] for s in report["servers"]] == ["epp"]
    for server in report["servers"]:
        (step,) = server["steps"]
        assert step["sent"] > 0 and step["ok"] == step["sent"], step["error_kinds"]
        assert step["picks"] == step["ok"]
        assert float(step["pick_ms"]["p95"]) > 0 and step["cpu_s"]["epp"] > 0
    markdown = (out / "report.md").read_text()
    assert markdown.count("| epp | 20 |") == 1
