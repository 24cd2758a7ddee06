"""``python -m epp_tools.bench.scale.heaptrim --quick``: both settings run and answer every
request. No RSS difference is asserted (the quick run's prompts are too small to leave much heap
behind; ``tests/unit/observability/test_heap_trim.py`` checks that a trim gives pages back)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_quick_run_measures_the_trimmer_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "heaptrim.json"
    done = subprocess.run(
        [sys.executable, "-m", "epp_tools.bench.scale.heaptrim", "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads(out.read_text())
    assert [r["interval"] for r in results] == [0.0, 0.5]
    assert all(r["answered"] == 8 and r["rss_quiet_mb"] > 0 for r in results)
    assert "| 0 (off) | 8 |" in done.stdout
