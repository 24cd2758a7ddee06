"""One worker of ``epp --workers N``: a normal ``App``, run as ``python -m epp _worker`` (an
internal subcommand, not in ``epp --help``; ``epp.cli`` hands it its logging setup).

The supervisor writes the worker's settings as JSON on stdin (``epp.workers.spec``). The worker
keeps its original stdout as the report channel and points file descriptor 1 at stderr, so a
stray ``print`` cannot corrupt the report. Once the App's servers listen it writes its ports as
one JSON line. SIGTERM drains the App exactly as in a single process (a second SIGTERM cuts the
drain short); the supervisor forwards its own SIGTERM to every worker.

A worker whose supervisor has gone (its parent pid changed: the supervisor was killed with
SIGKILL) stops at once rather than hold the shared port as an orphan.

Exit codes are the single process's: 0 after a clean stop, 2 when the configuration is refused,
anything else on a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import IO, Final

from epp.app import App
from epp.config.loader import ConfigError
from epp.eventloop import run
from epp.plugin import PluginError
from epp.settings import Settings
from epp.workers.spec import INDEX_ENV, WorkerReport, decode_settings

log = logging.getLogger(__name__)

STARTUP_TIMEOUT: Final = 120.0
"""Seconds the App may take to listen; the supervisor waits as long before killing it."""
ORPHAN_CHECK_INTERVAL: Final = 1.0


async def _listening(app: App, runner: asyncio.Task[None]) -> None:
    """Return once the App's servers listen or it failed; bounded by ``STARTUP_TIMEOUT``."""
    started = asyncio.create_task(app.wait_started())
    try:
        async with asyncio.timeout(STARTUP_TIMEOUT):
            await asyncio.wait({started, runner}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        started.cancel()


async def _stop_when_orphaned(app: App, parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_CHECK_INTERVAL)
    log.error("the supervisor (pid %d) is gone; stopping", parent)
    app.stop()
    app.stop()  # a second stop skips the drain: nobody is left to wait for it


async def serve(settings: Settings, report: IO[str]) -> None:
    """Run one App until it stops; write its ports to ``report`` once it listens."""
    app = App(settings)
    app.install_signal_handlers()
    runner = asyncio.create_task(app.run())
    await _listening(app, runner)
    if runner.done():
        await runner  # raises the start-up error
        return
    report.write(
        WorkerReport(os.getpid(), app.grpc_port, app.health_port, app.metrics_port).encode()
    )
    report.flush()
    orphan = asyncio.create_task(_stop_when_orphaned(app, os.getppid()))
    try:
        await runner
    finally:
        orphan.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await orphan


def main(setup_logging: Callable[..., None]) -> int:
    """The worker process; ``setup_logging(settings, worker=index)`` configures its logs."""
    index = int(os.environ.get(INDEX_ENV, "0"))
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    try:
        settings = decode_settings(sys.stdin.read())
    except ValueError as exc:
        print(f"epp: worker {index}: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings, worker=index)
    # the supervisor's last look at a worker that did not stop (epp.observability.stuck)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run(serve(settings, report), settings.event_loop)
    except (ConfigError, PluginError) as exc:
        print(f"epp: worker {index}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
