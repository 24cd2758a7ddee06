"""``/debug/runtime``: what a soak run samples (asyncio tasks, descriptors, threads, RSS)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from epp.observability.decisions import DecisionLog
from epp.observability.http import DebugViews, MetricsServer, runtime_stats
from epp.observability.memory import MemoryDebug


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


async def _get(port: int, query: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/debug/runtime{query}") as r,
    ):
        return r.status, await r.json()


async def _served() -> tuple[MetricsServer, int]:
    server = MetricsServer(DebugViews(CollectorRegistry(), dict, list, DecisionLog(), []))
    return server, await server.start("127.0.0.1", 0)


async def test_tracemalloc_views_refuse_with_the_hint_when_tracing_is_off() -> None:
    assert not tracemalloc.is_tracing()
    server, port = await _served()
    try:
        status, body = await _get(port, "?tracemalloc=baseline")
    finally:
        await server.stop()
    assert status == 400 and "PYTHONTRACEMALLOC" in body["error"]


async def test_tracemalloc_diff_names_the_site_that_grew_since_the_baseline() -> None:
    server, port = await _served()
    tracemalloc.start()
    try:
        status, body = await _get(port, "?tracemalloc=diff")
        assert status == 400 and "baseline" in body["error"]
        status, body = await _get(port, "?tracemalloc=baseline")
        assert status == 200 and body["tracemalloc"]["baseline"] is True
        kept = [bytearray(4096) for _ in range(256)]  # 1 MiB held from this line
        status, body = await _get(port, "?tracemalloc=diff&top=5")
    finally:
        tracemalloc.stop()
        await server.stop()
    assert status == 200 and len(kept) == 256
    assert body["tracemalloc"]["tracedBytes"] > 0
    top = body["tracemalloc"]["top"]
    assert len(top) <= 5
    here = [t for t in top if t["site"].startswith(__file__ + ":")]
    assert here and here[0]["bytesDiff"] >= 256 * 4096 and here[0]["blocksDiff"] >= 256


@pytest.mark.skipif(MemoryDebug().heap() is None, reason="needs glibc's mallinfo2")
async def test_heap_view_reports_the_c_allocator_and_trims_on_request() -> None:
    server, port = await _served()
    try:
        _, plain = await _get(port, "")
        _, heap = await _get(port, "?heap=1")
        _, trimmed = await _get(port, "?heap=trim")
    finally:
        await server.stop()
    assert "heap" not in plain
    assert heap["heap"]["inUseBytes"] > 0 and heap["heap"]["arenaBytes"] > 0
    assert "trimmed" not in heap["heap"] and trimmed["heap"]["trimmed"] in (0, 1)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


async def test_gc_view_counts_the_generations_and_collects_on_request() -> None:
    server, port = await _served()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the cycles below stay garbage until the view's collection
    try:
        _, counted = await _get(port, "?gc=1")
        for _ in range(50):
            _Cycle()
        _, collected = await _get(port, "?gc=collect")
    finally:
        if gc_was_enabled:
            gc.enable()
        await server.stop()
    assert len(counted["gc"]["tracked"]) == 3 and "collected" not in counted["gc"]
    assert len(counted["gc"]["stats"]) == 3
    assert collected["gc"]["collected"] >= 50


async def test_pymalloc_view_counts_arenas_and_the_bytes_small_objects_hold() -> None:
    server, port = await _served()
    try:
        _, plain = await _get(port, "")
        _, before = await _get(port, "?pymalloc=1")
        held = [object() for _ in range(200_000)]  # 16 bytes each: about 3 MB of small blocks
        _, after = await _get(port, "?pymalloc=1")
        del held
    finally:
        await server.stop()
    assert "pymalloc" not in plain
    grown = after["pymalloc"]["allocatedBytes"] - before["pymalloc"]["allocatedBytes"]
    assert grown >= 2_000_000
    assert after["pymalloc"]["arenas"] >= before["pymalloc"]["arenas"] >= 1
    assert after["pymalloc"]["arenasHighWater"] >= after["pymalloc"]["arenas"]
