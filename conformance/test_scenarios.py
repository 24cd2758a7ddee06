"""Black-box Endpoint Picker Protocol scenarios: any EPP command line behind a real Envoy.

The EPP under test is started as a subprocess from ``EPP_CONFORMANCE_COMMAND`` (default: this
repository's ``epp``), with upstream's flags: ``--config-file``, ``--grpc-port``,
``--grpc-health-port``, ``--metrics-port`` and ``--secure-serving=false``. Its config is a
scenario's plugin section plus ``file-discovery`` of the simulated pods, so the Go llm-d EPP can be
pointed at the same fixtures. Scenarios live in ``scenarios/*.yaml``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from string import Template
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet
from epp_tools.stack.envoy import Envoy, free_port

HERE = Path(__file__).parent
SCENARIOS = yaml.safe_load((HERE / "scenarios" / "routing.yaml").read_text())
CONFIGS = yaml.safe_load((HERE / "scenarios" / "configs.yaml").read_text())

pytestmark = [pytest.mark.envoy]


def epp_command() -> list[str]:
    cmd = os.environ.get("EPP_CONFORMANCE_COMMAND")
    return shlex.split(cmd) if cmd else [str(Path(sys.executable).parent / "epp")]


def config_file(workdir: Path, body: str, ports: list[int]) -> Path:
    eps = workdir / "endpoints.yaml"
    eps.write_text(
        yaml.safe_dump(
            {
                "endpoints": [
                    {
                        "name": f"pod-{i}",
                        "namespace": "default",
                        "address": "127.0.0.1",
                        "port": str(p),
                    }
                    for i, p in enumerate(ports)
                ]
            }
        )
    )
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        **yaml.safe_load(body),
    }
    doc["plugins"].append({"type": "file-discovery", "parameters": {"path": str(eps)}})
    doc["dataLayer"] = {"discovery": {"pluginRef": "file-discovery"}}
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    # bounds a failure only: an EPP process start on a busy machine takes tens of seconds
    async with asyncio.timeout(timeout):
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"EPP exited with {proc.returncode}")
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                    r = await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service="readiness"), timeout=1
                    )
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)


async def start_epp(workdir: Path, config: Path) -> tuple[subprocess.Popen[bytes], int]:
    # A free port is free only when chosen: another process on the machine may bind it before
    # the EPP does. That start fails fast and says so in its log; it is retried on new ports.
    for attempt in range(3):
        grpc_port, health_port = free_port(), free_port()
        log = open(workdir / "epp.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                *epp_command(),
                "--config-file",
                str(config),
                "--grpc-port",
                str(grpc_port),
                "--grpc-health-port",
                str(health_port),
                "--metrics-port",
                str(free_port()),
                "--secure-serving=false",
                "--drain-timeout=0s",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            await wait_ready(health_port, proc)
        except BaseException:
            proc.kill()
            text = (workdir / "epp.log").read_text()
            if attempt < 2 and "in use" in text.lower() and proc.wait() != 0:
                continue
            print(text[-3000:])
            raise
        return proc, grpc_port
    raise AssertionError("unreachable")


@pytest.fixture
async def stack() -> AsyncIterator[Any]:
    cleanup: list[Any] = []

    async def start(scenario: dict[str, Any]) -> tuple[SimFleet, Envoy]:
        pods = scenario["pods"]
        lora = tuple(scenario.get("lora_adapters", ()))
        fleet = SimFleet(
            [
                PodConfig(name=f"pod-{i}", time_scale=50.0, lora_adapters=lora, max_loras=2)
                for i in range(len(pods))
            ]
        )
        await fleet.__aenter__()
        cleanup.append(fleet)
        async with aiohttp.ClientSession() as s:
            for url, overrides in zip(fleet.urls, pods, strict=True):
                async with s.post(f"{url}/sim/overrides", json=overrides) as r:
                    assert r.status == 200
        workdir = Path(tempfile.mkdtemp(prefix="epp-conformance-"))
        proc, port = await start_epp(
            workdir, config_file(workdir, CONFIGS[scenario["config"]], fleet.ports)
        )
        cleanup.append(proc)
        envoy = Envoy("full-duplex", epp_port=port, epp_tls=False).start()
        cleanup.append(envoy)
        return fleet, envoy

    yield start
    for item in reversed(cleanup):
        if isinstance(item, SimFleet):
            await item.__aexit__(None, None, None)
        elif isinstance(item, subprocess.Popen):
            item.terminate()
            try:
                item.wait(10)
            except subprocess.TimeoutExpired:
                item.kill()
                item.wait(5)
        else:
            item.stop()


def _subst(value: Any, ports: dict[str, str]) -> Any:
    if isinstance(value, str):
        return Template(value).safe_substitute(ports)
    if isinstance(value, dict):
        return {k: _subst(v, ports) for k, v in value.items()}
    return value


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
async def test_scenario(stack: Any, scenario: dict[str, Any]) -> None:
    fleet, envoy = await stack(scenario)
    ports = {f"PORT_{i}": str(p) for i, p in enumerate(fleet.ports)}
    async with aiohttp.ClientSession() as s:
        for req in scenario["requests"]:
            req = _subst(req, ports)
            data = req["raw"].encode() if "raw" in req else json.dumps(req["body"]).encode()
            headers = {"content-type": "application/json", **req.get("headers", {})}
            async with s.post(envoy.url + req["path"], data=data, headers=headers) as r:
                body = await r.read()
                got = {k.lower(): v for k, v in r.headers.items()}
            expect = req["expect"]
            assert r.status == expect["status"], body
            if "pod" in expect:
                assert got.get("x-sim-pod") == f"pod-{expect['pod']}"
            for k, v in expect.get("headers", {}).items():
                assert got.get(k) == v, (k, got)
            if "body_prefix" in expect:
                assert body.decode().startswith(expect["body_prefix"]), body
            for k, v in expect.get("json", {}).items():
                assert json.loads(body)[k] == v
