"""One worker process as the supervisor sees it: spawn, learn its ports, ask its readiness,
signal it, wait for it.

The worker is ``python -m epp _worker`` (``epp.workers.worker``) in a session of its own, so a
terminal's Ctrl-C reaches only the supervisor, which forwards it once (a worker that also got
the terminal's SIGINT would take the forwarded one as a second signal and skip its drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.health import READINESS
from epp.workers.spec import COUNT_ENV, INDEX_ENV, WorkerReport

log = logging.getLogger(__name__)

WORKER_COMMAND: Final = (sys.executable, "-m", "epp", "_worker")
_SERVING: Final = health_pb2.HealthCheckResponse.SERVING


class WorkerStartError(Exception):
    """The worker exited, or did not report its ports in time, before it was listening."""

    def __init__(self, message: str, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Worker(Protocol):
    """What the supervisor needs of a worker process (a fake in unit tests)."""

    @property
    def pid(self) -> int: ...

    @property
    def report(self) -> WorkerReport | None: ...

    async def start(self, timeout: float) -> WorkerReport: ...

    async def wait(self) -> int: ...

    async def check_ready(self, timeout: float) -> bool: ...

    def send(self, sig: int) -> None: ...

    async def close(self) -> None: ...


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class WorkerProcess:
    """A worker spawned with ``command``; its settings (JSON) go to its stdin."""

    def __init__(
        self,
        *,
        index: int,
        count: int,
        settings_json: str,
        host: str,
        command: Sequence[str] = WORKER_COMMAND,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.index = index
        self._count = count
        self._settings_json = settings_json
        self._host = host
        self._command = tuple(command)
        self._environ = dict(os.environ if environ is None else environ)
        self._proc: asyncio.subprocess.Process | None = None
        self._channel: grpc.aio.Channel | None = None
        self.report: WorkerReport | None = None

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    async def start(self, timeout: float) -> WorkerReport:
        env = {**self._environ, INDEX_ENV: str(self.index), COUNT_ENV: str(self._count)}
        self._proc = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(self._settings_json.encode())
        with contextlib.suppress(ConnectionError):
            await self._proc.stdin.drain()
        self._proc.stdin.close()
        try:
            async with asyncio.timeout(timeout):
                line = await self._proc.stdout.readline()
        except TimeoutError:
            self.send(signal.SIGKILL)
            code = await self._proc.wait()
            raise WorkerStartError(f"not listening after {timeout:.0f}s; killed", code) from None
        if not line:
            code = await self._proc.wait()
            raise WorkerStartError(f"exited with code {code} before it was listening", code)
        try:
            self.report = WorkerReport.decode(line.decode())
        except (ValueError, KeyError, TypeError) as exc:
            self.send(signal.SIGKILL)
            code = await self._proc.wait()
            raise WorkerStartError(
                f"sent an unreadable report {line[:200]!r}: {exc}", code
            ) from None
        target = host_port(self._host, self.report.health_port)
        self._channel = grpc.aio.insecure_channel(target)
        return self.report

    async def wait(self) -> int:
        assert self._proc is not None, "start() first"
        return await self._proc.wait()

    async def check_ready(self, timeout: float) -> bool:
        """The worker's own ``readiness`` over its private health port; no answer = not ready."""
        if self._channel is None:
            return False
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            r = await stub.Check(health_pb2.HealthCheckRequest(service=READINESS), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return bool(r.status == _SERVING)

    def send(self, sig: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(sig)

    async def close(self) -> None:
        """Release the health channel (the process itself is waited for by ``wait``)."""
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
