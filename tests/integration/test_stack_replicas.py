"""``epp stack --replicas 2`` end to end: a real ``redis-server``, two EPP processes and one Envoy
balancing ext_proc streams over them. Both replicas must serve part of the workload, each must
apply facts the other published, nothing may fail, and nothing the command started may outlive
it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Real processes (pods, EPP, Envoy) started and driven: minutes on a busy machine. The bounds
# stop a hang; they are not a speed check.
pytestmark = [
    pytest.mark.envoy,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        shutil.which("redis-server") is None,
        reason="redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)",
    ),
]

EPP = str(Path(sys.executable).parent / "epp")
ROW = re.compile(
    r"^(epp-\d)\s+(\d+)\s+:(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)s\s+(yes|no)$"
)


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def test_stack_with_two_replicas_spreads_the_workload_and_shares_state_when_run() -> None:
    done = subprocess.run(
        [EPP, "stack", "--replicas", "2", "--skip-baseline", "--time-scale", "20"],
        capture_output=True, text=True, timeout=870, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 EPP replicas" in done.stdout and "sharing state through redis-server" in done.stdout
    # the mixed workload's row, then the agentic workload's
    summary, agentic = [line for line in done.stdout.splitlines() if line.startswith("EPP x2")]
    requests, errors = (int(x) for x in summary.split()[3:5])
    assert (requests, errors) == (60, 0)
    assert [int(x) for x in agentic.split()[3:5]] == [48, 0]
    rows = [m.groups() for line in done.stdout.splitlines() if (m := ROW.match(line))]
    assert [r[0] for r in rows] == ["epp-0", "epp-1"], done.stdout
    for name, pid, _, streams, served, published, applied, sync_errors, _, replayed in rows:
        assert int(served) > 0, f"{name} served no request"
        assert int(streams) == int(served)  # one ext_proc stream per request
        assert int(published) > 0 and int(applied) > 0, f"{name} shared nothing"
        assert (sync_errors, replayed) == ("0", "yes")
        assert not _alive(int(pid)), f"{name} outlived the command"
    assert sum(int(r[4]) for r in rows) == requests + 1  # and the first, routed request
    redis_port = re.search(r"redis-server 127\.0\.0\.1:(\d+)", done.stdout)
    assert redis_port is not None
    leftover = subprocess.run(
        ["pgrep", "-f", f"redis-server 127.0.0.1:{redis_port.group(1)}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert leftover.stdout == "", "redis-server outlived the command"
