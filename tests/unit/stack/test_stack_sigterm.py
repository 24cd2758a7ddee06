"""``epp stack`` under SIGTERM: it stops as on Ctrl-C, says so, and exits 143."""

from __future__ import annotations

import signal
import subprocess
import sys

SCRIPT = """
import asyncio, sys
from epp_tools.stack import cli

async def fake_main(args):
    try:
        print("running", flush=True)
        await asyncio.sleep(120)
    finally:
        print("cleaned up", flush=True)
    return 0

cli._main = fake_main
sys.exit(asyncio.run(cli._until_terminated(None)))
"""


def test_sigterm_runs_the_cleanup_and_exits_143() -> None:
    cmd = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert cmd.stdout is not None
    try:
        assert cmd.stdout.readline() == "running\n"  # the handler is installed by now
        cmd.send_signal(signal.SIGTERM)
        out, err = cmd.communicate(timeout=60)
    finally:
        if cmd.poll() is None:
            cmd.kill()
    assert cmd.returncode == 143
    assert out == "cleaned up\n"
    assert "everything started by this command is shut down (SIGTERM)" in err
