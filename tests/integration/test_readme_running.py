"""The README's "Run it by hand" commands for the pods and the EPP, as written, route a request
(``tests/integration/test_docs.py`` runs the whole section on the README's own ports; this test
holds when they are taken).

The EPP command is taken from the README's code block verbatim and run as a process from a
directory laid out like the repository (``deploy/configs/default.yaml`` as shipped), with only
its three ports moved to free ones. The two simulated pods the README starts with ``epp sim
--pods 2`` run in-process on free ports, and ``deploy/endpoints.yaml`` names them there,
since 8000 and 8001 may be taken on a shared machine. A request through a real Envoy is routed.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp_tools.stack.envoy import Envoy, free_port
from tests.conftest import COMPLETION, endpoints_yaml, post

ROOT = Path(__file__).resolve().parents[2]
DISCOVERED = next(
    p["parameters"]["path"]
    for p in yaml.safe_load((ROOT / "deploy/configs/default.yaml").read_text())["plugins"]
    if p["type"] == "file-discovery"
)
"""The endpoints file ``deploy/configs/default.yaml`` names (relative to the working directory)."""
BIN = Path(sys.executable).parent


def readme_commands() -> list[list[str]]:
    """The section's first two commands: the simulated pods, then the EPP."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Run it by hand\n")
    section = text[start : text.index("\n## ", start)]
    sim, epp = re.findall(r"```sh\n(.*?)```", section, re.S)[:2]
    return [shlex.split(block.strip()) for block in (sim, epp)]


async def _ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    async with asyncio.timeout(30):
        while proc.poll() is None:
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                    r = await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service="readiness"), timeout=1
                    )
                if r.status == serving:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError(f"epp exited with {proc.returncode}")


async def test_readme_command_routes_a_request_when_run_from_the_repository(
    tmp_path: Path, sim_pods: Any
) -> None:
    sim, epp = readme_commands()
    assert sim[:2] == [".venv/bin/epp", "sim"] and "--pods" in sim
    fleet = await sim_pods(int(sim[sim.index("--pods") + 1]))
    configs = tmp_path / "deploy" / "configs"
    configs.mkdir(parents=True)
    shutil.copy(ROOT / "deploy/configs/default.yaml", configs / "default.yaml")
    (tmp_path / DISCOVERED).write_text(endpoints_yaml(fleet.ports))
    grpc_port, health = free_port(), free_port()
    assert epp[0] == ".venv/bin/epp"
    argv = [str(BIN / "epp"), *epp[1:]]
    argv += [f"--grpc-port={grpc_port}", f"--grpc-health-port={health}"]
    argv += [f"--metrics-port={free_port()}", "--bind-address=127.0.0.1", "--drain-timeout=0s"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stderr=subprocess.PIPE)
    proxy = None
    try:
        await _ready(health, proc)
        proxy = Envoy("full-duplex", epp_port=grpc_port, epp_tls=False).start()
        status, headers, body = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200, body[:300]
        assert headers["x-sim-pod"] in {"pod-0", "pod-1"}
    finally:
        if proxy is not None:
            proxy.stop()
        proc.terminate()
        proc.wait(timeout=40)


def test_readme_endpoints_file_names_the_pods_the_sim_command_serves() -> None:
    sim, _ = readme_commands()
    pods = int(sim[sim.index("--pods") + 1])
    text = (ROOT / DISCOVERED).read_text()
    ports = sorted(int(p) for p in re.findall(r'port: "(\d+)"', text))
    assert ports == [8000 + i for i in range(pods)]  # epp sim: pod i on port 8000 + i
