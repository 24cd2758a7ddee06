"""The supervisor's logic with fake workers: restarts, giving up, refused configs, drain, the
second signal, killing stragglers, and group health over its real gRPC health port."""

from __future__ import annotations

import asyncio
import itertools
import signal
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.config.loader import ConfigError
from epp.settings import Settings
from epp.workers.policy import RestartPolicy
from epp.workers.process import Worker, WorkerStartError
from epp.workers.spec import WorkerReport
from epp.workers.supervisor import Supervisor

_PIDS = itertools.count(1000)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Script:
    """How one fake worker incarnation behaves."""

    start_exit: int | None = None
    """Exit with this code before listening."""
    run_exit: int | None = None
    """Exit with this code right after listening."""
    ready: bool = True
    drains: bool = True
    """SIGTERM ends it with 0; otherwise only SIGKILL ends it."""


class FakeWorker:
    def __init__(self, index: int, script: Script) -> None:
        self.index = index
        self.script = script
        self.pid = next(_PIDS)
        self.report: WorkerReport | None = None
        self.signals: list[int] = []
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def _finish(self, code: int) -> None:
        if not self._exit.done():
            self._exit.set_result(code)

    async def start(self, timeout: float) -> WorkerReport:
        await asyncio.sleep(0)
        if self.script.start_exit is not None:
            raise WorkerStartError("exited before it was listening", self.script.start_exit)
        self.report = WorkerReport(self.pid, 1, 2, 0)
        if self.script.run_exit is not None:
            asyncio.get_running_loop().call_later(0.01, self._finish, self.script.run_exit)
        return self.report

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def check_ready(self, timeout: float) -> bool:
        return self.script.ready

    def send(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self._finish(-signal.SIGKILL)
        elif sig == signal.SIGTERM and self.script.drains:
            self._finish(0)

    async def close(self) -> None:
        pass


class Fleet:
    """Spawns fake workers: slot i runs ``scripts[i]`` in turn, then ``default(i)``."""

    def __init__(self, scripts: dict[int, list[Script]], default: Callable[[int], Script]):
        self.scripts = {i: iter(s) for i, s in scripts.items()}
        self.default = default
        self.spawned: list[FakeWorker] = []

    def __call__(self, index: int) -> Worker:
        script = next(self.scripts.get(index, iter(())), None) or self.default(index)
        worker = FakeWorker(index, script)
        self.spawned.append(worker)
        return worker

    def of(self, index: int) -> list[FakeWorker]:
        return [w for w in self.spawned if w.index == index]


def _settings(**kw: object) -> Settings:
    base: dict[str, object] = {
        "workers": 2,
        "grpc_port": 0,
        "grpc_health_port": 0,
        "metrics_port": 0,
        "bind_address": "127.0.0.1",
        "secure_serving": False,
        "drain_timeout": 0.0,
    }
    return Settings(**{**base, **kw})  # type: ignore[arg-type]


def _supervisor(fleet: Fleet, **kw: object) -> Supervisor:
    policy = kw.pop("policy", lambda: RestartPolicy(first_delay=0.01))
    return Supervisor(
        _settings(**kw),
        spawn=fleet,
        policy=policy,  # type: ignore[arg-type]
        health_interval=0.01,
        stop_grace=0.2,
    )


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


Start = Callable[[Supervisor], "asyncio.Task[int]"]


@pytest.fixture
def running() -> Iterator[Start]:
    tasks: list[asyncio.Task[int]] = []

    def start(sup: Supervisor) -> asyncio.Task[int]:
        tasks.append(asyncio.create_task(sup.run()))
        return tasks[-1]

    yield start
    for t in tasks:
        t.cancel()


async def test_a_worker_that_exits_is_restarted_and_the_group_stays_ready(running: Start) -> None:
    fleet = Fleet({}, lambda i: Script())
    sup = _supervisor(fleet)
    task = running(sup)
    await _until(sup.health.ready)
    fleet.of(0)[0]._finish(-9)  # killed from outside
    await _until(lambda: sup.slots[0].restarts == 1 and sup.health.ready_flags[0])
    assert sup.health.ready()
    assert len(fleet.of(0)) == 2 and len(fleet.of(1)) == 1
    sup.stop()
    assert await asyncio.wait_for(task, 5) == 0


async def test_a_crash_loop_stops_the_group_with_a_clear_error(running: Start) -> None:
    fleet = Fleet({}, lambda i: Script(run_exit=3) if i == 0 else Script())
    sup = _supervisor(fleet, policy=lambda: RestartPolicy(max_crashes=3, first_delay=0.01))
    code = await asyncio.wait_for(running(sup), 5)
    assert code == 1
    assert sup.failure == "worker 0 exited 3 times within 60s (last exit code 3); giving up"
    assert len(fleet.of(0)) == 3
    assert fleet.of(1)[0].signals == [signal.SIGTERM]  # the rest of the group drained


async def test_a_worker_refusing_the_configuration_stops_the_group_with_2(running: Start) -> None:
    fleet = Fleet({0: [Script(start_exit=2)]}, lambda i: Script())
    sup = _supervisor(fleet)
    assert await asyncio.wait_for(running(sup), 5) == 2
    assert sup.failure == "worker 0 refused the configuration"
    assert len(fleet.of(0)) == 1  # not restarted


async def test_stop_drains_every_worker_once_and_exits_0(running: Start) -> None:
    fleet = Fleet({}, lambda i: Script())
    sup = _supervisor(fleet, workers=3)
    task = running(sup)
    await _until(sup.health.ready)
    sup.stop()
    assert not sup.health.ready()
    assert await asyncio.wait_for(task, 5) == 0
    assert [w.signals for w in fleet.spawned] == [[signal.SIGTERM]] * 3


async def test_a_second_stop_is_forwarded_and_stragglers_are_killed(running: Start) -> None:
    fleet = Fleet({}, lambda i: Script(drains=False))
    sup = _supervisor(fleet)
    task = running(sup)
    await _until(sup.health.ready)
    sup.stop()
    await asyncio.sleep(0.05)
    sup.stop()
    assert await asyncio.wait_for(task, 5) == 1
    for w in fleet.spawned:
        assert w.signals == [signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1, signal.SIGKILL]


async def test_a_worker_failing_its_drain_fails_the_exit_code(
    running: Start,
) -> None:
    fleet = Fleet({}, lambda i: Script(drains=False))
    sup = _supervisor(fleet)
    task = running(sup)
    await _until(sup.health.ready)
    sup.stop()
    fleet.spawned[0]._finish(0)
    fleet.spawned[1]._finish(1)
    assert await asyncio.wait_for(task, 5) == 1


async def _status(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
        return int(reply.status)


async def test_the_health_port_answers_for_the_group(running: Start) -> None:
    late = Script(ready=False, drains=False)
    fleet = Fleet({1: [late]}, lambda i: Script(drains=False))
    sup = _supervisor(fleet)
    task = running(sup)
    await _until(lambda: sup.health.ready_flags[0])
    await asyncio.sleep(0.05)
    assert await _status(sup.health_port, "readiness") == NOT_SERVING  # not all ready yet
    assert await _status(sup.health_port, "liveness") == SERVING
    late.ready = True
    await _until(sup.health.ready)
    assert await _status(sup.health_port, "readiness") == SERVING
    assert await _status(sup.health_port, "") == SERVING
    sup.stop()
    assert await _status(sup.health_port, "readiness") == NOT_SERVING  # draining
    assert await _status(sup.health_port, "liveness") == SERVING
    for w in fleet.spawned:
        w._finish(0)
    assert await asyncio.wait_for(task, 5) == 0


@pytest.mark.parametrize(
    ("flag", "field"),
    [("--grpc-health-port", "grpc_health_port"), ("--metrics-port", "metrics_port")],
)
async def test_a_group_port_in_use_is_refused_naming_the_flag(flag: str, field: str) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        fleet = Fleet({}, lambda i: Script())
        sup = _supervisor(fleet, **{field: port})
        with pytest.raises(ConfigError, match=f"^{flag}: cannot bind 127.0.0.1:{port}"):
            await asyncio.wait_for(sup.run(), 5)
        assert fleet.spawned == []
