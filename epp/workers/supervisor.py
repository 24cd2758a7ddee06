"""The supervisor of ``epp --workers N``: N worker processes behind one set of ports.

See the package docstring (``epp.workers``) for what the group promises; this module runs it:

1. Refuse a configuration without a cross-replica syncer (:func:`require_syncer`).
2. Reserve the ext_proc port (:func:`reserve_port`), make the group's certificate when TLS is on
   without ``--cert-path``, serve health (``epp.server.health`` over :class:`GroupHealth`) and
   the metrics port (``epp.workers.front``).
3. Keep each worker slot running (:meth:`Supervisor._keep`): start, wait, restart by the
   :class:`RestartPolicy`, or give up and stop the group.
4. Poll every worker's readiness every ``HEALTH_INTERVAL``.
5. On SIGTERM/SIGINT drain: readiness NOT_SERVING, SIGTERM to every worker (each drains for
   ``--drain-timeout``), wait; a second signal is forwarded (the workers cut their drain short).
   Workers still running ``STOP_GRACE`` seconds after their drain window are asked for their
   threads' stacks (SIGUSR1, ``epp.observability.stuck``) and killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2_grpc

from epp.config.loader import ConfigError
from epp.eventloop import run
from epp.k8s.review import metrics_reviewer
from epp.observability.http import PortOptions
from epp.server.health import HealthServicer
from epp.server.tls import metrics_tls
from epp.settings import Settings
from epp.workers.front import GroupFront, WorkerView
from epp.workers.policy import GroupHealth, RestartPolicy
from epp.workers.preflight import group_certificate, require_syncer, reserve_port
from epp.workers.process import Worker, WorkerProcess, WorkerStartError
from epp.workers.spec import encode_settings

WORKER_HOST: Final = "127.0.0.1"
"""Where a worker's health and metrics servers listen (``Settings.group_member``)."""
log = logging.getLogger(__name__)

HEALTH_INTERVAL: Final = 0.25
HEALTH_TIMEOUT: Final = 1.0
STARTUP_TIMEOUT: Final = 120.0
STOP_GRACE: Final = 10.0
"""Seconds a worker may take to stop after its drain window (servers, plugins) before SIGKILL."""
DUMP_WAIT: Final = 0.5
"""Seconds between asking a stuck worker for its stacks (SIGUSR1) and killing it."""

CONFIG_REFUSED: Final = 2
FAILED: Final = 1


@dataclass
class Slot:
    """One worker position: its current process, restart policy and history."""

    index: int
    policy: RestartPolicy
    worker: Worker | None = None
    restarts: int = 0
    last_exit: int | None = None
    clean: bool = True
    """The last stop was a clean one (exit 0, or stopped before it listened)."""

    def view(self, ready: bool) -> WorkerView:
        w = self.worker
        report = w.report if w is not None else None
        info: dict[str, Any] = {
            "worker": self.index,
            "pid": w.pid if w is not None else 0,
            "running": report is not None and self.last_exit is None,
            "ready": ready,
            "ports": dataclasses.asdict(report) if report is not None else None,
            "restarts": self.restarts,
            "last_exit": self.last_exit,
        }
        port = report.metrics_port if report is not None and self.last_exit is None else 0
        return WorkerView(index=self.index, metrics_port=port, info=info)


class Supervisor:
    """Runs ``settings.workers`` workers until stopped; :meth:`run` returns the exit code."""

    def __init__(
        self,
        settings: Settings,
        *,
        spawn: Callable[[int], Worker] | None = None,
        policy: Callable[[], RestartPolicy] = RestartPolicy,
        health_interval: float = HEALTH_INTERVAL,
        stop_grace: float = STOP_GRACE,
        start_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        self.settings = settings
        self.size = settings.workers
        self.health = GroupHealth(self.size)
        self.slots = [Slot(i, policy()) for i in range(self.size)]
        self._spawn = spawn or self._spawn_process
        self._health_interval = health_interval
        self._stop_grace = stop_grace
        self._start_timeout = start_timeout
        self._host = WORKER_HOST  # workers' private servers listen on loopback only
        self._worker_json = ""
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        self._failure: tuple[int, str] | None = None
        self._killed = False
        self.front = GroupFront(workers=self._views, host=self._host, size=self.size)
        self.grpc_port = 0
        self.health_port = 0
        self.metrics_port = 0

    # ---- the group ----------------------------------------------------------------------------

    async def run(self) -> int:
        async with contextlib.AsyncExitStack() as stack:
            await self._open(stack)
            log.info(
                "supervising %d workers: ext_proc on %d (shared, SO_REUSEPORT), health on %d, "
                "metrics on %d",
                self.size,
                self.grpc_port,
                self.health_port,
                self.metrics_port,
            )
            async with asyncio.TaskGroup() as tg:
                keepers = [tg.create_task(self._keep(slot)) for slot in self.slots]
                others = [tg.create_task(self._poll_health()), tg.create_task(self._deadline())]
                await asyncio.wait(keepers)
                for t in others:
                    t.cancel()
        return self.exit_code()

    def exit_code(self) -> int:
        if self._failure is not None:
            return self._failure[0]
        return 0 if not self._killed and all(s.clean for s in self.slots) else FAILED

    @property
    def failure(self) -> str | None:
        return self._failure[1] if self._failure is not None else None

    async def _open(self, stack: contextlib.AsyncExitStack) -> None:
        """Hold the ext_proc port, make the workers' settings, serve health and metrics."""
        s = self.settings
        sock = reserve_port(s.bind_address, s.grpc_port)
        stack.callback(sock.close)
        self.grpc_port = int(sock.getsockname()[1])
        cert_path = s.cert_path
        if s.secure_serving and not cert_path:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="epp-workers-"))
            cert_path = group_certificate(Path(tmp))
        worker = dataclasses.replace(
            s,
            workers=1,
            group_member=True,
            grpc_port=self.grpc_port,
            grpc_health_port=0,
            metrics_port=0,
            cert_path=cert_path,
            metrics_endpoint_auth=False,  # the supervisor's port checks; workers are private
            metrics_cert_dir="",
            metrics_client_ca_file="",
            metrics_token="",
            config_file="",
        )
        self._worker_json = encode_settings(worker)
        # Explicitly not SO_REUSEPORT: a second group on this host must not share health.
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(self.health.ready), server)
        try:
            self.health_port = server.add_insecure_port(f"{s.bind_address}:{s.grpc_health_port}")
        except RuntimeError:
            raise ConfigError(
                f"--grpc-health-port: cannot bind {s.bind_address}:{s.grpc_health_port}"
            ) from None
        await server.start()
        stack.push_async_callback(server.stop, None)
        stack.push_async_callback(self.front.stop)
        try:
            ssl_context, certs = metrics_tls(s)
        except ValueError as exc:
            raise ConfigError(f"--metrics-cert-dir: {exc}") from None
        if certs is not None and s.enable_cert_reload:
            watch = asyncio.get_running_loop().create_task(certs.watch())
            stack.callback(watch.cancel)
        options = PortOptions(metrics_reviewer(s), ssl_context, s.enable_debug_endpoints)
        try:
            self.metrics_port = await self.front.start(s.bind_address, s.metrics_port, options)
        except OSError as exc:
            raise ConfigError(
                f"--metrics-port: cannot bind {s.bind_address}:{s.metrics_port}: {exc}"
            ) from None

    def _spawn_process(self, index: int) -> Worker:
        return WorkerProcess(
            index=index, count=self.size, settings_json=self._worker_json, host=self._host
        )

    def _views(self) -> list[WorkerView]:
        flags = self.health.ready_flags
        return [slot.view(flags[slot.index]) for slot in self.slots]

    # ---- one slot -----------------------------------------------------------------------------

    async def _keep(self, slot: Slot) -> None:
        """Run the slot's worker, restarting it by the policy, until the group stops."""
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            code = await self._run_once(slot)
            if self._stopping.is_set():
                return
            if code == CONFIG_REFUSED and not self.health.warm:
                self._fail(CONFIG_REFUSED, f"worker {slot.index} refused the configuration")
                return
            delay = slot.policy.on_crash(loop.time())
            if delay is None:
                self._fail(
                    FAILED,
                    f"worker {slot.index} exited {slot.policy.recent_crashes()} times within "
                    f"{slot.policy.window:.0f}s (last exit code {code}); giving up",
                )
                return
            pid = slot.worker.pid if slot.worker is not None else 0
            log.warning(
                "worker %d (pid %d) exited with code %s; restarting in %.1fs",
                slot.index,
                pid,
                code,
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if not self._stopping.is_set():
                slot.restarts += 1
                self.front.restarts.labels(str(slot.index)).inc()

    async def _run_once(self, slot: Slot) -> int:
        """Start the slot's worker and wait for it to exit; its exit code."""
        worker = self._spawn(slot.index)
        slot.worker, slot.last_exit = worker, None
        try:
            code = await self._serve(slot, worker)
        finally:
            await worker.close()
        slot.last_exit = code
        self.health.set(slot.index, False)
        return code

    async def _serve(self, slot: Slot, worker: Worker) -> int:
        try:
            report = await worker.start(self._start_timeout)
        except OSError as exc:  # could not even spawn it
            log.error("worker %d could not start: %s", slot.index, exc)
            slot.clean = False
            return FAILED
        except WorkerStartError as exc:
            log.error("worker %d (pid %d) %s", slot.index, worker.pid, exc)
            code = FAILED if exc.exit_code is None else exc.exit_code
            # Stopped by our own signal while it was still starting: it never served.
            slot.clean = self._stopping.is_set() and code in (0, -signal.SIGTERM, -signal.SIGINT)
            return code
        log.info("worker %d (pid %d) listening", slot.index, report.pid)
        if self._stopping.is_set():
            worker.send(signal.SIGTERM)  # the stop came while it was starting
        code = await worker.wait()
        slot.clean = code == 0
        if self._stopping.is_set():  # otherwise _keep says what happens next
            level = logging.INFO if code == 0 else logging.ERROR
            log.log(level, "worker %d (pid %d) exited with code %d", slot.index, report.pid, code)
        return code

    # ---- health -------------------------------------------------------------------------------

    async def _poll_health(self) -> None:
        """Ask every listening worker's readiness, every ``health_interval``, until cancelled."""
        while True:
            await asyncio.gather(*(self._check(slot) for slot in self.slots))
            await asyncio.sleep(self._health_interval)

    async def _check(self, slot: Slot) -> None:
        worker = slot.worker
        if worker is None or worker.report is None or slot.last_exit is not None:
            return
        ready = await worker.check_ready(HEALTH_TIMEOUT)
        if slot.worker is worker and slot.last_exit is None:
            was_warm = self.health.warm
            self.health.set(slot.index, ready)
            if self.health.warm and not was_warm:
                log.info("all %d workers ready", self.size)

    # ---- stopping -----------------------------------------------------------------------------

    def stop(self) -> None:
        """First call: drain every worker. A later call cuts the drain short."""
        if self._stopping.is_set():
            log.info("second stop: the workers cut their drain short")
            self._force.set()
            return
        log.info("draining %d workers for %.1fs", self.size, self.settings.drain_timeout)
        self.health.drain()
        self._stopping.set()
        self._signal_all(signal.SIGTERM)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)

    def _fail(self, code: int, message: str) -> None:
        log.error("%s; stopping the group", message)
        if self._failure is None:
            self._failure = (code, message)
        self.stop()

    def _signal_all(self, sig: int) -> None:
        for slot in self.slots:
            if slot.worker is not None and slot.last_exit is None:
                slot.worker.send(sig)

    async def _deadline(self) -> None:
        """Once stopping: forward each further stop, and kill the workers still running
        ``stop_grace`` seconds after the drain window (or after a second stop)."""
        await self._stopping.wait()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_timeout + self._stop_grace
        while True:
            try:
                await asyncio.wait_for(self._force.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
            self._force.clear()
            self._signal_all(signal.SIGTERM)
            deadline = min(deadline, loop.time() + self._stop_grace)
        log.error(
            "workers still running after the drain window and %.0fs; their threads' stacks "
            "follow, then they are killed",
            self._stop_grace,
        )
        self._killed = True
        self._signal_all(signal.SIGUSR1)  # each dumps its threads' stacks to the shared stderr
        await asyncio.sleep(DUMP_WAIT)  # a signal has no answer to wait for: give it a moment
        self._signal_all(signal.SIGKILL)


def supervise(settings: Settings) -> int:
    """``epp --workers N``: run the group until it stops; the process exit code.

    0: every worker drained and exited cleanly. 1: a worker crash-looped, failed to stop, or had
    to be killed. 2: the configuration was refused (by the supervisor or by a worker)."""
    try:
        require_syncer(settings)
    except ConfigError as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return CONFIG_REFUSED

    async def main() -> int:
        supervisor = Supervisor(settings)
        supervisor.install_signal_handlers()
        code = await supervisor.run()
        if supervisor.failure is not None:
            print(f"epp: {supervisor.failure}", file=sys.stderr)
        return code

    try:
        return run(main(), settings.event_loop)
    except ConfigError as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return CONFIG_REFUSED
