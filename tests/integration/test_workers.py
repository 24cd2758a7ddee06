"""``epp --workers 2`` as a real process: two workers share the ext_proc port behind a real Envoy,
the supervisor answers health and metrics for the group, and SIGTERM drains both.

The kernel (SO_REUSEPORT) spreads *connections* over the workers, and Envoy keeps one HTTP/2
connection per worker thread; so the test's Envoy opens a new connection to the EPP for every
request (``max_requests_per_connection: 1``), which makes both workers take requests.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from epp_tools.stack.envoy import free_port
from tests.conftest import COMPLETION, endpoints_yaml, epp_config, post

pytestmark = [pytest.mark.envoy]

EPP = str(Path(sys.executable).parent / "epp")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1)
        return int(reply.status)


async def _until_serving(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with asyncio.timeout(60):
        while True:
            assert proc.poll() is None, f"epp exited with {proc.returncode}:\n{log.read_text()}"
            try:
                if await _status(port, "readiness") == SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)


async def _get(url: str) -> tuple[dict[str, str], str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        return dict(r.headers), await r.text()


def _requests_per_worker(metrics: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == "llm_d_epp_request_total":
                out[s.labels["worker"]] = out.get(s.labels["worker"], 0.0) + s.value
    return out


@pytest.fixture
def epp_process(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(args: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log = tmp_path / "epp.log"
        with open(log, "wb") as out:
            started.append(subprocess.Popen([EPP, *args], stdout=out, stderr=out))
        return started[-1], log

    yield start
    for proc in started:  # a failed test: stop the group (its workers stop with it)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


async def test_two_workers_share_the_port_answer_as_a_group_and_drain_on_sigterm(
    tmp_path: Path,
    sim_pods: Any,
    envoy: Any,
    redis_server: Any,
    epp_process: Any,
) -> None:
    redis = redis_server()
    fleet = await sim_pods(2)
    eps = tmp_path / "eps.yaml"
    eps.write_text(endpoints_yaml(fleet.ports))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        epp_config(
            eps,
            f"""\
            plugins:
            - type: redis-syncer
              parameters: {{url: "{redis.url}"}}
            - type: queue-scorer
            - type: prefix-cache-scorer
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
                weight: 1
              - pluginRef: prefix-cache-scorer
                weight: 1
            dataLayer:
              crossReplicaSyncerPluginRef: redis-syncer
            """,
        )
    )
    grpc_port, health, metrics = free_port(), free_port(), free_port()
    proc, log = epp_process(
        [
            "--workers=2",
            f"--config-file={cfg}",
            f"--grpc-port={grpc_port}",
            f"--grpc-health-port={health}",
            f"--metrics-port={metrics}",
            "--bind-address=127.0.0.1",
            "--drain-timeout=8s",  # room for the checks below on a loaded machine
        ]
    )
    await _until_serving(health, proc, log)
    assert await _status(health, "liveness") == SERVING
    _, body = await _get(f"http://127.0.0.1:{metrics}/debug/workers")
    workers = json.loads(body)["workers"]
    pids = [w["pid"] for w in workers]
    assert [w["worker"] for w in workers] == [0, 1] and all(pids)
    assert all(w["ready"] and w["running"] for w in workers)
    assert all(w["ports"]["grpc_port"] == grpc_port for w in workers)

    # A new connection per ext_proc stream: the kernel spreads connections over the workers.
    app = SimpleNamespace(grpc_port=grpc_port, settings=SimpleNamespace(secure_serving=True))
    e = envoy(app, epp_max_requests_per_connection=1)
    for i in range(24):
        request = {**COMPLETION, "prompt": f"request {i} " + "shared prefix " * 20}
        status, _, text = await post(f"{e.url}/v1/completions", request)
        assert status == 200, text
    _, page = await _get(f"http://127.0.0.1:{metrics}/metrics")
    per_worker = _requests_per_worker(page)
    assert set(per_worker) == {"0", "1"} and all(v > 0 for v in per_worker.values()), per_worker
    assert sum(per_worker.values()) == 24
    headers, _ = await _get(f"http://127.0.0.1:{metrics}/debug/endpoints")
    assert headers["x-epp-worker"] in ("0", "1")

    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    await asyncio.sleep(0.4)
    assert proc.poll() is None, "the group stopped without draining"
    assert await _status(health, "readiness") == NOT_SERVING
    assert await _status(health, "liveness") == SERVING
    status, _, text = await post(f"{e.url}/v1/completions", COMPLETION)  # still served
    assert status == 200, text
    code = await asyncio.to_thread(proc.wait, 30)
    elapsed = time.monotonic() - t0
    output = log.read_text()
    assert code == 0, output
    assert elapsed > 7.8, output
    for i in (0, 1):
        assert re.search(rf"epp\.app draining for 8\.0s worker={i}$", output, re.M), output
        assert f"worker {i} (pid {pids[i]}) exited with code 0" in output
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
