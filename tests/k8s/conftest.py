"""Fixtures of the Kubernetes tests: a test API server, EPP Apps and ``epp`` processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.app import App
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.stack.envoy import free_port
from tests.conftest import make_settings

POOL = "vllm-pool"
MODEL_LABELS = {"app": "vllm"}
EPP = str(Path(sys.executable).parent / "epp")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture
def apiserver() -> Iterator[LocalApiServer]:
    with LocalApiServer(bookmark_interval=0.2) as server:
        yield server


async def start_kube_app(
    stack: contextlib.AsyncExitStack,
    kubeconfig: Path,
    *,
    ready: bool = True,
    config_text: str | None = None,
    **kw: Any,
) -> App:
    """A running App in InferencePool mode (pool ``vllm-pool`` in ``default`` unless told
    otherwise) with the built-in default config, entered into ``stack``."""
    kw.setdefault("pool_name", "" if kw.get("endpoint_selector") else POOL)
    kw.setdefault("pool_namespace", "default")
    app = App(make_settings(config_text, kubeconfig=str(kubeconfig), **kw))  # type: ignore[arg-type]
    await stack.enter_async_context(app)
    if ready:
        await app.wait_ready(60)  # bounds a failure only; a busy machine is slow
    return app


@pytest.fixture
async def kube_app(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await kube_app(server, ready=True, **settings)`` → a running App against ``server``."""
    stack = contextlib.AsyncExitStack()

    async def start(server: LocalApiServer, **kw: Any) -> App:
        kubeconfig = server.write_kubeconfig(tmp_path / f"kubeconfig-{len(stack._exit_callbacks)}")
        return await start_kube_app(stack, kubeconfig, **kw)

    yield start
    await stack.aclose()


# ---- real epp processes -------------------------------------------------------------------------


@pytest.fixture
def epp_processes(tmp_path: Path) -> Iterator[Callable[..., tuple[Any, int]]]:
    """``epp_processes(kubeconfig, lease, renew, retry, drain="0s", namespace="default")`` →
    ``(Popen, health port)`` of an ``epp`` with leader election; killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        kubeconfig: Path,
        lease: float,
        renew: float,
        retry: float,
        drain: str = "0s",
        namespace: str = "default",
    ) -> tuple[Any, int]:
        health_port = free_port()
        log = open(tmp_path / f"epp-{len(started)}.log", "wb")  # noqa: SIM115 - the process owns it
        proc = subprocess.Popen(
            [
                EPP,
                f"--pool-name={POOL}",
                f"--pool-namespace={namespace}",
                f"--kubeconfig={kubeconfig}",
                "--ha-enable-leader-election",
                f"--ha-lease-duration={lease}s",
                f"--ha-renew-deadline={renew}s",
                f"--ha-retry-period={retry}s",
                f"--drain-timeout={drain}",
                "--secure-serving=false",
                "--bind-address=127.0.0.1",
                f"--grpc-port={free_port()}",
                f"--grpc-health-port={health_port}",
                f"--metrics-port={free_port()}",
            ],
            env={**os.environ, "NO_PROXY": "*", "no_proxy": "*"},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        started.append(proc)
        return proc, health_port

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def health(port: int, service: str = "readiness") -> int | None:
    """The gRPC health status of ``service`` (None while the server does not answer)."""
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1
            )
            return int(reply.status)
    except grpc.aio.AioRpcError:
        return None


async def leader_and_follower(
    procs: list[tuple[Any, int]], timeout: float = 30
) -> tuple[tuple[Any, int], tuple[Any, int]]:
    """Wait until one process is ready (the leader) and the other answers NOT_SERVING."""
    async with asyncio.timeout(timeout):
        while True:
            states = [await health(port) for _, port in procs]
            if sorted(s for s in states if s is not None) == sorted([NOT_SERVING, SERVING]):
                return procs[states.index(SERVING)], procs[states.index(NOT_SERVING)]
            await asyncio.sleep(0.1)


async def wait_serving(port: int, timeout: float) -> float:
    """Seconds until ``readiness`` on ``port`` answers SERVING."""
    t0 = time.monotonic()
    async with asyncio.timeout(timeout):
        while await health(port) != SERVING:
            await asyncio.sleep(0.05)
    return time.monotonic() - t0
