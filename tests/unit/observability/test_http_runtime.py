"""``/debug/runtime``: what a soak run samples (asyncio tasks, descriptors, threads, RSS)."""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client import CollectorRegistry

from epp.observability.decisions import DecisionLog
from epp.observability.http import DebugViews, MetricsServer, runtime_stats


async def test_runtime_counts_the_tasks_of_the_running_loop() -> None:
    before = runtime_stats()
    release = asyncio.Event()
    extra = [asyncio.create_task(release.wait()) for _ in range(3)]
    during = runtime_stats()
    release.set()
    await asyncio.gather(*extra)
    assert during["asyncioTasks"] == before["asyncioTasks"] + 3
    assert during["openFds"] > 0 and during["threads"] >= 1 and during["rssBytes"] > 1 << 20


async def test_runtime_is_served_on_the_metrics_port() -> None:
    views = DebugViews(CollectorRegistry(), dict, list, DecisionLog(), [])
    server = MetricsServer(views)
    port = await server.start("127.0.0.1", 0)
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(f"http://127.0.0.1:{port}/debug/runtime") as r,
        ):
            body = await r.json()
    finally:
        await server.stop()
    assert set(body) == {"asyncioTasks", "openFds", "threads", "rssBytes"}
    assert body["asyncioTasks"] >= 1
