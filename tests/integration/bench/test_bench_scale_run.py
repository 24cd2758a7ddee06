"""``epp bench scale --quick`` end to end: a small ramp of agents through Envoy and the EPP to a
simulated fleet, with its report, JSON and plot. Nothing here asserts a speed; only that every
turn was answered, that the EPP picked, and that the figures are in the report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(150)]

EPP = str(Path(sys.executable).parent / "epp")


def test_the_quick_ramp_answers_every_turn_and_reports_each_step(tmp_path: Path) -> None:
    done = subprocess.run(
        [EPP, "bench", "scale", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "ramp-quick.json").read_text())
    (target,) = report["targets"]
    assert target["status"] == "ok"
    assert [s["agents"] for s in target["steps"]] == report["run"]["steps"]
    for step in target["steps"]:
        assert step["answered"] > 0 and step["errors"] == 0, step["error_kinds"]
        assert step["pick"]["picks"] > 0 and step["cores"]["epp"] > 0
        assert step["rss_mb_peak"]["epp"] > 0 and "envoy" in step["cores"]
        assert 0.5 < step["oracle_share"] <= 1.0
    markdown = (tmp_path / "ramp-quick.md").read_text()
    assert markdown.count("\n| 8 |") == 1 and markdown.count("\n| 16 |") == 1
    assert (tmp_path / "ramp-quick.png").stat().st_size > 10_000
