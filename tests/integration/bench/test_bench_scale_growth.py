"""``epp bench scale growth --quick``: the cost curves measured in process, with their report.
No speed is asserted; only that every request was routed, that the figures are there, and that
the EPP's memory grows with the sessions it holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

EPP = str(Path(sys.executable).parent / "epp")


def test_the_quick_growth_curves_route_every_request_and_report_the_ratios(tmp_path: Path) -> None:
    done = subprocess.run(
        [EPP, "bench", "scale", "growth", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "growth-quick.json").read_text())
    curves = report["curves"]
    assert [p["pods"] for p in curves["pods"]] == [4, 16]
    assert [p["sessions"] for p in curves["sessions"]] == [100, 400]
    assert [p["context"] for p in curves["context"]] == [4096, 16384]
    for points in curves.values():
        for p in points:
            assert p["failed"] == 0 and p["cpu_us_median"] > 0
    few, many = curves["sessions"]
    assert many["rss_mb_sessions"] > few["rss_mb_sessions"]  # the sessions' prefix blocks
    assert any(v.startswith("CPU per request at 16 pods") for v in report["verdicts"])
    assert (tmp_path / "growth-quick.png").stat().st_size > 10_000


async def test_long_contexts_are_routed_one_after_the_other_on_one_connection() -> None:
    # The in-process client acknowledges the server's SETTINGS: without it every stream kept the
    # default 65,535-byte window and the second 260 KB body ended the connection with a
    # FLOW_CONTROL_ERROR, so the long-context points of the curve failed all their requests.
    from epp_tools.bench.scale.growth import Sessions
    from epp_tools.bench.scale.inproc import InProcessEpp

    async with InProcessEpp(4, 1) as epp:
        epp.refresh_metrics()
        sessions = Sessions(3, 65_536, 1)
        for s in (0, 1, 2, 0):
            path, body, chunks = sessions.request(s)
            assert len(body) > 200_000
            assert await epp.request(path, body, chunks) > 0
        assert epp.failed == 0
