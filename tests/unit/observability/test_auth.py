"""The metrics port's auth through a real App: 401 without the token, 200 with it, /debug
behind the same check and removable, pprof behind it too; the verdict cache."""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest

from epp.observability.auth import ALLOWED, CachedReviewer, StaticToken, Verdict

TOKEN = "s3cret-token"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def get(port: int, path: str, token: str | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}{path}", headers=headers) as r,
    ):
        return r.status, await r.text()


async def test_static_token_guards_metrics_and_debug(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False, metrics_token=TOKEN)
    port = app.metrics_port
    assert (await get(port, "/metrics"))[0] == 401
    assert (await get(port, "/metrics", "wrong"))[0] == 401
    status, body = await get(port, "/metrics", TOKEN)
    assert status == 200 and "llm_d_epp" in body
    assert (await get(port, "/debug/decisions"))[0] == 401
    assert (await get(port, "/debug/config", TOKEN))[0] == 200
    basic = {"Authorization": f"Basic {TOKEN}"}  # not a bearer scheme
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/metrics", headers=basic) as r,
    ):
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"


async def test_auth_off_serves_openly(start_app: Any) -> None:
    app = await start_app(
        [closed_port()], ready=False, metrics_token=TOKEN, metrics_endpoint_auth=False
    )
    assert (await get(app.metrics_port, "/metrics"))[0] == 200


async def test_debug_endpoints_can_be_turned_off(start_app: Any) -> None:
    app = await start_app(
        [closed_port()], ready=False, metrics_token=TOKEN, enable_debug_endpoints=False
    )
    assert (await get(app.metrics_port, "/metrics", TOKEN))[0] == 200
    for path in ("/debug/config", "/debug/decisions", "/debug/pprof/profile?seconds=1"):
        assert (await get(app.metrics_port, path, TOKEN))[0] == 404, path


async def test_pprof_profile_behind_auth(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False, metrics_token=TOKEN)
    port = app.metrics_port
    assert (await get(port, "/debug/pprof/profile?seconds=1"))[0] == 401
    assert (await get(port, "/debug/pprof/profile?seconds=0", TOKEN))[0] == 400
    assert (await get(port, "/debug/pprof/profile?seconds=9999", TOKEN))[0] == 400
    status, body = await get(port, "/debug/pprof/profile?seconds=1&format=text", TOKEN)
    assert status == 200 and "function calls" in body, body[:300]
    async with (
        aiohttp.ClientSession() as s,
        s.get(
            f"http://127.0.0.1:{port}/debug/pprof/profile?seconds=1",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as r,
    ):
        assert r.status == 200
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert len(await r.read()) > 0


@pytest.mark.both_loops
async def test_pprof_clock_cpu_leaves_waits_out(start_app: Any) -> None:
    """A profile of a second during which a callback on the loop blocks for half of it: the wall
    clock counts the wait, the loop thread's CPU time almost none of it. (The loop's own idle
    wait is counted by the wall clock on asyncio's loop only: uvloop waits inside libuv, where
    cProfile does not look.)"""
    app = await start_app([closed_port()], ready=False, metrics_token=TOKEN)
    port = app.metrics_port

    async def seconds(clock: str) -> float:
        path = f"/debug/pprof/profile?seconds=1&format=text&clock={clock}"
        answer = asyncio.ensure_future(get(port, path, TOKEN))
        async with asyncio.timeout(10):  # this thread's profiler is on: the profile has begun
            while sys.getprofile() is None:
                await asyncio.sleep(0.01)
        time.sleep(0.5)  # a callback of the loop that blocks, inside the profile
        status, body = await answer
        assert status == 200, body[:300]
        found = re.search(r"function calls.* in ([0-9.]+) seconds", body)
        assert found is not None, body[:300]
        return float(found.group(1))

    assert await seconds("wall") >= 0.45
    assert await seconds("cpu") < 0.25
    assert (await get(port, "/debug/pprof/profile?seconds=1&clock=sometimes", TOKEN))[0] == 400


async def test_pprof_index_lists_the_profiles_served_as_go_does(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False, metrics_token=TOKEN)
    port = app.metrics_port
    assert (await get(port, "/debug/pprof/"))[0] == 401
    for path in ("/debug/pprof/", "/debug/pprof"):  # Go's mux redirects the bare path
        status, page = await get(port, path, TOKEN)
        assert status == 200 and "Types of profiles available:" in page, path
    links = re.findall(r"<a href='([^']+)'>([^<]+)</a>", page)
    assert links == [("cmdline", "cmdline"), ("profile", "profile")]
    assert "<div class=profile-name>profile: </div> CPU profile" in page
    # each link, resolved against the index like a browser does, is served
    status, argv = await get(port, urljoin("/debug/pprof/", "cmdline"), TOKEN)
    assert status == 200 and argv.split("\x00") == sys.orig_argv
    status, text = await get(port, urljoin("/debug/pprof/", "profile?seconds=1&format=text"), TOKEN)
    assert status == 200 and "function calls" in text


async def test_pprof_off(start_app: Any) -> None:
    app = await start_app([closed_port()], ready=False, metrics_token=TOKEN, enable_pprof=False)
    for path in ("/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/profile?seconds=1"):
        assert (await get(app.metrics_port, path, TOKEN))[0] == 404, path
    assert (await get(app.metrics_port, "/debug/config", TOKEN))[0] == 200


class Counting:
    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        self.calls = 0
        self.gate = asyncio.Event()

    async def review(self, token: str, path: str, verb: str) -> Verdict:
        self.calls += 1
        await self.gate.wait()
        return self.verdict


async def test_cache_remembers_for_its_ttl_and_shares_one_review() -> None:
    now = [0.0]
    inner = Counting(ALLOWED)
    cache = CachedReviewer(inner, clock=lambda: now[0], allow_ttl=60, deny_ttl=5, entries=2)
    waiting = [asyncio.create_task(cache.review("t", "/metrics", "get")) for _ in range(3)]
    await asyncio.sleep(0)
    inner.gate.set()
    assert [await w for w in waiting] == [ALLOWED] * 3
    assert inner.calls == 1
    now[0] = 59.0
    await cache.review("t", "/metrics", "get")
    assert inner.calls == 1
    now[0] = 61.0
    await cache.review("t", "/metrics", "get")
    assert inner.calls == 2
    for path in ("/a", "/b", "/c"):
        await cache.review("t", path, "get")
    assert len(cache) == 2  # bounded


async def test_cache_never_keeps_a_failed_review() -> None:
    class Failing:
        calls = 0

        async def review(self, token: str, path: str, verb: str) -> Verdict:
            self.calls += 1
            raise ConnectionError("api server down")

    inner = Failing()
    cache = CachedReviewer(inner)
    for _ in range(2):
        with pytest.raises(ConnectionError):
            await cache.review("t", "/metrics", "get")
    assert inner.calls == 2 and len(cache) == 0


async def test_static_token_compares_whole_token() -> None:
    st = StaticToken(TOKEN)
    assert (await st.review(TOKEN, "/metrics", "get")).status == 200
    assert (await st.review(TOKEN[:-1], "/metrics", "get")).status == 401
    with pytest.raises(ValueError):
        StaticToken("")
