"""The ``epp`` process itself: start-up errors, SIGTERM drain."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_tools.stack.envoy import free_port
from tests.conftest import dead_ports, endpoints_yaml, epp_config

EPP = str(Path(sys.executable).parent / "epp")


async def check(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        r = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=1
        )
        return int(r.status)


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_sigterm_turns_readiness_off_keeps_serving_then_exits(
    tmp_path: Path, loop: str
) -> None:
    eps = tmp_path / "eps.yaml"
    eps.write_text(endpoints_yaml(dead_ports(2)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(epp_config(eps))
    health = free_port()
    proc = subprocess.Popen(
        [
            EPP,
            "--config-file",
            str(cfg),
            "--grpc-port",
            str(free_port()),
            "--grpc-health-port",
            str(health),
            "--metrics-port",
            str(free_port()),
            "--drain-timeout=1500ms",
            "--bind-address",
            "127.0.0.1",
            f"--event-loop={loop}",
            "--zap-encoder=json",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        serving = health_pb2.HealthCheckResponse.SERVING
        async with asyncio.timeout(15):
            while True:
                try:
                    if await check(health, "readiness") == serving:
                        break
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        await asyncio.sleep(0.3)
        assert proc.poll() is None  # still draining
        assert await check(health, "readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await check(health, "liveness") == serving
        assert proc.wait(timeout=60) == 0
        # one-sided: the drain window (1.5 s) was honoured; a busy machine only makes it longer
        assert time.monotonic() - t0 > 1.2
        assert proc.stderr is not None
        serving_lines = [
            json.loads(line) for line in proc.stderr.read().splitlines() if b'"serving"' in line
        ]
        assert [line["eventLoop"] for line in serving_lines] == [loop]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_bad_config_exits_2_with_the_reason(tmp_path: Path) -> None:
    out = subprocess.run(
        [EPP, "--config-text", "apiVersion: x\nkind: y\n"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "apiVersion: unsupported 'x'" in out.stderr


def test_kubernetes_mode_without_a_cluster_fails_clearly(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    out = subprocess.run(
        [EPP, "--pool-name", "p"], capture_output=True, text=True, timeout=30, env=env
    )
    assert out.returncode == 2
    assert "no cluster configuration" in out.stderr
