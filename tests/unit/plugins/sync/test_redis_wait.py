"""``redis-syncer``'s waiting receive (``XREAD BLOCK``) against a real ``redis-server``: it wakes
on a peer's publish, never holds up a publish of its own replica, and is cancelled cleanly."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from epp.plugin import Delivery
from tests.unit.plugins.sync.test_redis import make


async def blocked(server: Any, n: int = 1) -> None:
    """Until ``n`` clients wait in a blocking command (``CLIENT LIST`` flag ``b``)."""
    raw = server.client()
    async with asyncio.timeout(5):
        while sum("b" in c["flags"] for c in raw.client_list()) < n:
            await asyncio.sleep(0.01)


async def test_a_waiting_receive_returns_as_soon_as_a_peer_publishes(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    await b.receive()
    started = time.monotonic()
    waiting = asyncio.create_task(b.receive(wait=5.0))
    await blocked(server)  # b waits in XREAD BLOCK
    await a.publish({"p": [1]})
    async with asyncio.timeout(2):
        got = await waiting
    assert got == [Delivery(a.replica_id, {"p": [1]})]
    assert time.monotonic() - started < 2.0
    await asyncio.gather(a.stop(), b.stop())


async def test_an_empty_wait_returns_after_the_wait(redis_server) -> None:
    server = redis_server()
    b = make(server.url)
    await b.receive()
    started = time.monotonic()
    assert await b.receive(wait=0.2) == []
    assert 0.15 < time.monotonic() - started < 1.0
    await b.stop()


async def test_a_publish_goes_out_while_its_own_receive_waits(redis_server) -> None:
    server = redis_server()
    a = make(server.url)
    await a.receive()
    waiting = asyncio.create_task(a.receive(wait=5.0))
    await blocked(server)
    async with asyncio.timeout(1):  # one connection per side: not queued behind the XREAD
        await a.publish({"p": [2]})
    async with asyncio.timeout(2):
        assert [d.batch for d in await waiting] == [{"p": [2]}]
    await a.stop()


async def test_a_cancelled_wait_keeps_the_cursor_and_the_next_receive_works(redis_server) -> None:
    server = redis_server()
    a, b = make(server.url), make(server.url)
    await b.receive()
    cursor = b.dump_state()["cursor"]
    waiting = asyncio.create_task(b.receive(wait=5.0))
    await blocked(server)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert b.dump_state()["cursor"] == cursor
    await a.publish({"p": [3]})
    async with asyncio.timeout(2):
        assert [d.batch for d in await b.receive(wait=1.0)] == [{"p": [3]}]
    await asyncio.gather(a.stop(), b.stop())


async def test_a_waiting_receive_fails_at_once_when_redis_goes_away(redis_server) -> None:
    server = redis_server()
    b = make(server.url)
    await b.receive()
    waiting = asyncio.create_task(b.receive(wait=5.0))
    await blocked(server)
    started = time.monotonic()
    server.kill()
    with pytest.raises(Exception):  # noqa: B017 - any error means "unavailable"
        async with asyncio.timeout(3):
            await waiting
    assert time.monotonic() - started < 3.0
    assert b.dump_state()["lastError"]
    server.start()
    assert await b.receive() == []  # reconnects (the log is empty: read from the start)
    await b.stop()


async def test_a_paused_redis_bounds_a_waiting_receive_by_timeout_plus_wait(redis_server) -> None:
    server = redis_server()
    b = make(server.url, timeout="200ms")
    await b.receive()
    server.client().execute_command("CLIENT", "PAUSE", "2000", "ALL")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await b.receive(wait=0.3)
    assert time.monotonic() - started < 1.0
