"""Readiness waits for the first scrape: an EPP that has not read any pod's metrics yet answers
NOT_SERVING on the readiness health service, and becomes SERVING once the scrape completes.

The pod's ``/metrics`` is held by the simulator's ``stall_metrics`` fault, so the first scrape is
in flight (and counted by the simulator) while the EPP is asked whether it is ready.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.app import App
from tests.conftest import endpoints_yaml, epp_config, make_settings, wait_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def readiness(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=5
        )
        return int(resp.status)


async def sim_stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(f"{url}/sim/stats") as resp:
        result: dict[str, Any] = await resp.json()
        return result


async def test_a_stalled_first_scrape_keeps_the_epp_unready_until_it_completes(
    sim_pods: Any, tmp_path: Path
) -> None:
    fleet = await sim_pods(1)
    url = fleet.urls[0]
    ep_file = tmp_path / "endpoints.yaml"
    ep_file.write_text(endpoints_yaml(fleet.ports))
    app = App(make_settings(epp_config(ep_file)))
    # A scrape that times out also ends the first cycle; give the held one all the time it needs,
    # so only its completion can make the EPP ready here.
    app.collector._poll_timeout = 30.0
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/sim/faults", json={"stall_metrics": True}) as resp:
            assert resp.status == 200
        async with app:
            stalled = asyncio.Event()

            async def poll_stats() -> None:
                if (await sim_stats(http, url))["stalled_scrapes"] >= 1:
                    stalled.set()

            async with asyncio.timeout(10):
                while not stalled.is_set():
                    await poll_stats()
                    await asyncio.sleep(0.02)
            assert app.store.ids(), "discovery published the pod"
            assert not app.ready()
            assert await readiness(app.health_port) == NOT_SERVING

            async with http.post(f"{url}/sim/faults", json={}) as resp:
                assert resp.status == 200
            await wait_for(app.ready, 10)
            assert await readiness(app.health_port) == SERVING
            (endpoint,) = app.store.snapshot()
            assert endpoint.metrics.update_time > 0, "ready because the scrape completed"
