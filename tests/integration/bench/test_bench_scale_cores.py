"""``epp bench scale cores --quick``: the per-request and per-chunk cost through Envoy at one low
rate, for one EPP and for ``epp --workers 2``, and the computed line. No cost is asserted (the
quick run is too short to resolve one); only that every request was answered and the line is
there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from epp_tools.stack.redis import available as redis_available

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(150)]

EPP = str(Path(sys.executable).parent / "epp")


@pytest.mark.skipif(not redis_available(), reason="epp --workers 2 shares state through Redis")
def test_the_quick_cores_run_answers_every_request_and_computes_the_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [EPP, "bench", "scale", "cores", "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "cores-quick.json").read_text())
    assert [g["workers"] for g in report["groups"]] == [1, 2]
    for group in report["groups"]:
        assert group["status"] == "ok"
        assert all(s["errors"] == 0 for s in group["steps"]), group["steps"]
        assert group["big"]["errors"] == 0 and group["big"]["answered"] > 0
        assert group["turns"]["errors"] == 0 and group["turns"]["answered"] > 0
        assert group["turns"]["tokens"] == group["big"]["tokens"]
        line = group["computed"]
        assert line["go_cores_chunks_only"] == pytest.approx(110_000 * 37e-6, abs=0.01)
        assert line["cores"] == pytest.approx(line["cores_requests"] + line["cores_chunks"], 0.02)
        # the quick run's slopes span 2 s each: on a busy machine one can come out 0, clamped
        assert line["cores_turns"] >= 0 and "us_per_request_turn" in line
    two = report["groups"][1]
    assert len(two["big"]["us_per_request_by_worker"]) == 2  # each worker measured on its own
    assert two["big"]["us_applied_per_request"] > 0  # the EPP timed the applying
    by_plugin = two["big"]["us_applied_by_plugin"]  # and said which plugin it was
    assert by_plugin["approx-prefix-cache-producer"] > 0
    assert sum(by_plugin.values()) == pytest.approx(two["big"]["us_applied_per_request"], abs=1)
    slopes = two["big"]["us_applied_slope_by_plugin"]  # what grows with the requests, apart
    assert set(slopes) == set(by_plugin) and min(slopes.values()) >= 0
    assert two["computed"]["us_applied_195k"] == two["big"]["us_applied_slope"]
    assert "llm-d's Go EPP" in (tmp_path / "cores-quick.md").read_text()
