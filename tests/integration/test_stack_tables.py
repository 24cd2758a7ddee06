"""``epp stack`` end to end, as the README's first command runs it: the mixed workload's table,
then the agentic workload's, each through the EPP and through Envoy's round robin on fresh
fleets, every request answered. On the agentic workload the EPP keeps each agent on the pod
that holds its context, so the pods report a far higher share of cached prompt tokens than round
robin gets (the TTFT it saves is a measurement, shown in the table, not asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [pytest.mark.envoy, pytest.mark.slow, pytest.mark.timeout(900)]

EPP = str(Path(sys.executable).parent / "epp")


def _rows(lines: list[str], header: str) -> dict[str, list[str]]:
    """The rows of the table printed under the line starting with ``header``."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    columns = next(i for i in range(start, len(lines)) if lines[i].startswith("target "))
    rows = {}
    for line in lines[columns + 2 :]:
        if not line.strip():
            break
        target, rest = line[:24].strip(), line[24:].split()
        rows[target] = rest
    return rows


def test_stack_prints_the_mixed_and_the_agentic_tables_when_run() -> None:
    done = subprocess.run(
        [EPP, "stack", "--time-scale", "20"],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    mixed = _rows(lines, "same seeded workload")
    agentic = _rows(lines, "8 coding agents x 6 turns")
    assert list(mixed) == list(agentic) == ["EPP (default config)", "Envoy round robin"]
    assert all(row[:2] == ["60", "0"] for row in mixed.values()), mixed
    assert all(row[:2] == ["48", "0"] for row in agentic.values()), agentic
    hit = {target: float(row[2].rstrip("%")) for target, row in agentic.items()}
    assert hit["EPP (default config)"] > hit["Envoy round robin"] + 20, agentic
    described = lines.index(next(x for x in lines if x.startswith("8 coding agents")))
    assert "time scale 1x" in lines[described + 1]
