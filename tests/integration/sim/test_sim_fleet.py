"""Many pods in one process, and the command line."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time

import aiohttp
import pytest

from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

MODEL = "fleet-model"


async def test_twenty_pods_serve_on_own_ports_when_started_in_one_process() -> None:
    configs = [PodConfig(name=f"p{i}", model=MODEL, time_scale=200.0) for i in range(20)]
    async with SimFleet(configs) as fleet, aiohttp.ClientSession() as http:
        assert len(set(fleet.ports)) == 20

        async def ask(url: str) -> str:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                return resp.headers["x-sim-pod"]

        served = await asyncio.gather(*(ask(url) for url in fleet.urls))
    assert served == [f"p{i}" for i in range(20)]


@pytest.mark.slow
async def test_idle_pods_cost_little_cpu_when_nothing_is_running() -> None:
    configs = [PodConfig(name=f"idle{i}", model=MODEL) for i in range(100)]
    async with SimFleet(configs):
        await asyncio.sleep(0.1)
        cpu = time.process_time()
        await asyncio.sleep(1.0)
        spent = time.process_time() - cpu
    # generous: 100 idle pods must not poll; a busy process would spend the whole second
    assert spent < 0.25


async def test_only_the_pod_whose_kv_runs_out_preempts_and_its_metrics_count_it() -> None:
    # pod "small" holds 24 blocks of 16 tokens; six requests of 3 prompt blocks each growing by
    # 40 tokens outgrow it while running (vLLM's RECOMPUTE preemption); "large" holds them all
    # at a slow enough clock (2x real time, each request about 120 ms) that the six run together
    # even when the machine is busy: at 200x they finished one by one and none was preempted
    small = PodConfig(name="small", model=MODEL, time_scale=2.0, num_gpu_blocks=24)
    large = PodConfig(name="large", model=MODEL, time_scale=2.0, num_gpu_blocks=400)
    async with SimFleet([small, large]) as fleet, aiohttp.ClientSession() as http:

        async def ask(url: str, i: int) -> int:
            body = {"model": MODEL, "prompt": f"q{i:02d} " + "word " * 44, "max_tokens": 40}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status

        for url in fleet.urls:
            assert await asyncio.gather(*(ask(url, i) for i in range(6))) == [200] * 6

        async def preemptions(url: str) -> float:
            async with http.get(f"{url}/metrics") as resp:
                page = await resp.text()
            line = next(x for x in page.splitlines() if x.startswith("vllm:num_preemptions_total"))
            return float(line.rsplit(" ", 1)[1])

        counted = [await preemptions(url) for url in fleet.urls]
        engine_count = fleet.runtime(0).engine.stats.preemptions
    assert counted[0] >= 1
    assert counted[0] == engine_count
    assert counted[1] == 0


async def test_concurrent_load_queues_when_batch_is_small() -> None:
    # real time: 20 tokens x ~6 ms = ~120 ms per request, so the queue is observable
    config = PodConfig(name="busy", model=MODEL, time_scale=1.0, max_num_seqs=2)
    async with SimFleet([config]) as fleet, aiohttp.ClientSession() as http:
        url = fleet.urls[0]

        async def ask(i: int) -> int:
            body = {"model": MODEL, "prompt": f"q{i}", "max_tokens": 20}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                return resp.status

        tasks = [asyncio.ensure_future(ask(i)) for i in range(6)]
        runtime = fleet.runtime(0)
        seen = set()
        for _ in range(400):  # admission happens at step boundaries: watch a few steps
            seen.add((runtime.engine.num_running, runtime.engine.num_waiting))
            if (2, 4) in seen:
                break
            await asyncio.sleep(0.002)
        assert (2, 4) in seen
        assert all(running <= 2 for running, _ in seen)
        assert await asyncio.gather(*tasks) == [200] * 6
        assert runtime.engine.stats.finished["length"] == 6


def free_port_block(n: int) -> int:
    """A base port whose next ``n`` ports were free a moment ago."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise AssertionError("no free port block")


async def test_cli_serves_pods_and_exits_cleanly_when_sigterm_arrives() -> None:
    base = free_port_block(3)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "epp_tools.sim", "--pods", "3", "--port", str(base),
        "--model", MODEL, "--time-scale", "100", "--pod-name-prefix", "cli-",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines = [
            (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip() for _ in range(3)
        ]
        assert lines == [
            f"sim pod cli-{i} listening on http://127.0.0.1:{base + i}" for i in range(3)
        ]
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            async with http.post(f"http://127.0.0.1:{base + 2}/v1/completions", json=body) as r:
                assert (r.status, r.headers["x-sim-pod"]) == (200, "cli-2")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
