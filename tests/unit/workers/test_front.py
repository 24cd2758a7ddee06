"""The group's metrics port: the union of the workers' /metrics, and /debug/* answered by a
worker that says who it is."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epp.observability.metrics import EppMetrics
from epp.workers.front import GroupFront, WorkerView


def _page(requests: int) -> str:
    m = EppMetrics()
    for _ in range(requests):
        m.request_total.inc(("m", "m", "", "0"), ("m", "m", "0"))
    return generate_latest(m.registry).decode()


async def _fake_worker(index: int, decisions: set[str]) -> web.AppRunner:
    """A worker's private metrics port: its page, one debug view, decisions it holds."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=_page(index + 1))

    async def config(request: web.Request) -> web.Response:
        return web.json_response({"answered_by": index, "query": dict(request.query)})

    async def decision(request: web.Request) -> web.Response:
        if request.match_info["rid"] in decisions:
            return web.json_response({"request_id": request.match_info["rid"]})
        return web.json_response({"error": "no decision"}, status=404)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/config", config)
    app.router.add_get("/debug/decisions/{rid}", decision)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


@pytest.fixture
async def front() -> AsyncIterator[Callable[..., Any]]:
    stack = contextlib.AsyncExitStack()

    async def start(views: list[WorkerView]) -> str:
        f = GroupFront(workers=lambda: views, host="127.0.0.1", size=len(views))
        port = await f.start("127.0.0.1", 0)
        stack.push_async_callback(f.stop)
        return f"http://127.0.0.1:{port}"

    async def worker(index: int, decisions: set[str] = set()) -> WorkerView:  # noqa: B006
        runner = await _fake_worker(index, decisions)
        stack.push_async_callback(runner.cleanup)
        port = runner.addresses[0][1]
        return WorkerView(index=index, metrics_port=port, info={"worker": index})

    start.worker = worker  # type: ignore[attr-defined]
    yield start
    await stack.aclose()


async def _get(url: str) -> tuple[int, dict[str, str], str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, dict(r.headers), await r.text()


async def test_metrics_are_the_union_labelled_by_worker_with_up_per_worker(front: Any) -> None:
    w0, w1 = await front.worker(0), await front.worker(1)
    gone = WorkerView(index=2, metrics_port=1, info={})  # nothing listens on port 1
    url = await front([w0, w1, gone])
    status, _, text = await _get(f"{url}/metrics")
    assert status == 200
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    requests = {s.labels["worker"]: s.value for s in samples if s.name == "llm_d_epp_request_total"}
    assert requests == {"0": 1.0, "1": 2.0}
    up = {s.labels["worker"]: s.value for s in samples if s.name == "llm_d_epp_worker_up"}
    assert up == {"0": 1.0, "1": 1.0, "2": 0.0}
    restarts = [s for s in samples if s.name == "llm_d_epp_worker_restarts_total"]
    assert {s.labels["worker"] for s in restarts} == {"0", "1", "2"}


async def test_a_debug_view_names_the_worker_that_answered_and_rotates(front: Any) -> None:
    url = await front([await front.worker(0), await front.worker(1)])
    answered = set()
    for _ in range(4):
        status, headers, body = await _get(f"{url}/debug/config?limit=3")
        assert status == 200
        assert f'"answered_by": {headers["x-epp-worker"]}' in body
        assert '"query": {"limit": "3"}' in body
        answered.add(headers["x-epp-worker"])
    assert answered == {"0", "1"}


async def test_worker_query_picks_the_worker(front: Any) -> None:
    url = await front([await front.worker(0), await front.worker(1)])
    for _ in range(3):
        status, headers, body = await _get(f"{url}/debug/config?worker=1")
        assert (status, headers["x-epp-worker"]) == (200, "1")
        assert '"query": {}' in body  # the selector is not passed on
    status, _, body = await _get(f"{url}/debug/config?worker=7")
    assert status == 503 and "worker '7' is not listening" in body


async def test_a_decision_is_found_on_the_worker_that_routed_it(front: Any) -> None:
    url = await front([await front.worker(0), await front.worker(1, {"req-9"})])
    status, headers, body = await _get(f"{url}/debug/decisions/req-9")
    assert (status, headers["x-epp-worker"]) == (200, "1")
    assert '"request_id": "req-9"' in body
    status, _, _ = await _get(f"{url}/debug/decisions/unknown")
    assert status == 404


async def test_workers_view_lists_what_the_supervisor_knows(front: Any) -> None:
    url = await front([await front.worker(0), WorkerView(1, 0, {"worker": 1, "pid": 0})])
    status, _, body = await _get(f"{url}/debug/workers")
    assert status == 200
    assert body == '{"workers": [{"worker": 0}, {"worker": 1, "pid": 0}]}'


async def test_no_listening_worker_is_a_503(front: Any) -> None:
    url = await front([WorkerView(0, 0, {})])
    status, _, body = await _get(f"{url}/debug/endpoints")
    assert status == 503 and "no worker is listening" in body


async def test_the_group_port_applies_auth_and_the_debug_switch() -> None:
    from epp.observability.auth import StaticToken
    from epp.observability.http import PortOptions

    runner = await _fake_worker(0, set())
    view = WorkerView(index=0, metrics_port=runner.addresses[0][1], info={"worker": 0})
    f = GroupFront(workers=lambda: [view], host="127.0.0.1", size=1)
    port = await f.start("127.0.0.1", 0, PortOptions(reviewer=StaticToken("t"), debug=False))
    url = f"http://127.0.0.1:{port}"
    try:
        assert (await _get(f"{url}/metrics"))[0] == 401
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as s:
            async with s.get(f"{url}/metrics") as r:
                assert r.status == 200 and "llm_d_epp_worker_up" in await r.text()
            for path in ("/debug/workers", "/debug/config"):
                async with s.get(f"{url}{path}") as r:
                    assert r.status == 404, path
    finally:
        await f.stop()
        await runner.cleanup()
