"""The group's metrics port, served by the supervisor.

- ``/metrics``: every listening worker's ``/metrics``, fetched concurrently from its private port
  (each within ``SCRAPE_TIMEOUT``) and merged by ``epp.workers.exposition.union`` (label
  ``worker``), followed by the supervisor's own families: ``llm_d_epp_worker_up{worker}`` (1 when
  that worker's page was in this answer) and ``llm_d_epp_worker_restarts_total{worker}``.
- ``/debug/*``: the single process's debug views, answered by one worker and passed through
  unchanged; the ``x-epp-worker`` response header names the worker that answered. ``?worker=<i>``
  picks the worker; without it the views rotate over the listening workers, except
  ``/debug/decisions/<request id>``, which asks each worker in turn, because only the worker that
  routed a request holds its decision.
- ``/debug/workers``: the supervisor's own view: each worker's pid, ports, readiness and restarts.

The port's auth, TLS and ``--enable-debug-endpoints`` are the supervisor's (``PortOptions``); the
workers' private ports serve plain, unauthenticated HTTP on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from epp.observability.auth import auth_middleware
from epp.observability.http import PortOptions
from epp.observability.profile import MAX_SECONDS
from epp.workers.exposition import WORKER_LABEL, union
from epp.workers.process import host_port

SCRAPE_TIMEOUT: Final = 2.0
DEBUG_TIMEOUT: Final = 5.0
WORKER_HEADER: Final = "x-epp-worker"


@dataclass(frozen=True)
class WorkerView:
    """What the front knows of one worker: its index, and its metrics port once listening."""

    index: int
    metrics_port: int
    info: Mapping[str, Any]
    """Shown as is on ``/debug/workers``."""


class GroupFront:
    """The aiohttp server of the metrics port. ``workers`` is read on every request."""

    def __init__(self, *, workers: Callable[[], Sequence[WorkerView]], host: str, size: int):
        self._workers = workers
        self._host = host
        self._rotation = itertools.count()
        self.registry = CollectorRegistry()
        self.up = Gauge(
            "llm_d_epp_worker_up",
            "1 when the worker's metrics are in this scrape, 0 when it did not answer",
            [WORKER_LABEL],
            registry=self.registry,
        )
        self.restarts = Counter(
            "llm_d_epp_worker_restarts",
            "Times the supervisor restarted the worker after it exited",
            [WORKER_LABEL],
            registry=self.registry,
        )
        for i in range(size):
            self.restarts.labels(str(i))
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, bind: str, port: int, options: PortOptions | None = None) -> int:
        o = options or PortOptions()
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=DEBUG_TIMEOUT), trust_env=False
        )
        web_app = web.Application(
            middlewares=[auth_middleware(o.reviewer)] if o.reviewer is not None else []
        )
        web_app.router.add_get("/metrics", self._metrics)
        if o.debug:
            web_app.router.add_get("/debug/workers", self._list)
            web_app.router.add_get("/debug/{view:.*}", self._debug)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, bind, port, ssl_context=o.ssl_context)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _listening(self) -> list[WorkerView]:
        return [w for w in self._workers() if w.metrics_port]

    async def _get(
        self, w: WorkerView, path: str, timeout: float, params: Mapping[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """(status, Content-Type, body) of ``path`` on the worker's private metrics port."""
        assert self._session is not None
        url = f"http://{host_port(self._host, w.metrics_port)}{path}"
        to = aiohttp.ClientTimeout(total=timeout)
        async with self._session.get(url, params=params, timeout=to) as r:
            ctype = r.headers.get("Content-Type", "application/octet-stream")
            return r.status, ctype, await r.read()

    async def _page(self, w: WorkerView) -> str | None:
        try:
            status, _, body = await self._get(w, "/metrics", SCRAPE_TIMEOUT)
        except (aiohttp.ClientError, TimeoutError):
            return None
        return body.decode() if status == 200 else None

    async def _metrics(self, _: web.Request) -> web.Response:
        workers = self._listening()
        pages = await asyncio.gather(*(self._page(w) for w in workers))
        got = {w.index: p for w, p in zip(workers, pages, strict=True) if p is not None}
        for w in self._workers():
            self.up.labels(str(w.index)).set(1 if w.index in got else 0)
        body = union(got) + generate_latest(self.registry).decode()
        return web.Response(body=body.encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _list(self, _: web.Request) -> web.Response:
        return web.json_response({"workers": [dict(w.info) for w in self._workers()]})

    def _choose(self, request: web.Request, view: str) -> list[WorkerView] | str:
        """The workers to ask, in order, or an error message."""
        workers = self._listening()
        wanted = request.query.get("worker")
        if wanted is not None:
            chosen = [w for w in workers if str(w.index) == wanted]
            return chosen or f"worker {wanted!r} is not listening"
        if not workers:
            return "no worker is listening"
        if view.startswith("decisions/"):
            return workers
        return [workers[next(self._rotation) % len(workers)]]

    async def _debug(self, request: web.Request) -> web.Response:
        view = request.match_info["view"]
        chosen = self._choose(request, view)
        if isinstance(chosen, str):
            return web.json_response({"error": chosen}, status=503)
        params = {k: v for k, v in request.query.items() if k != "worker"}
        timeout = DEBUG_TIMEOUT + (MAX_SECONDS if view.startswith("pprof/") else 0)
        answer: web.Response | None = None
        for w in chosen:
            try:
                status, ctype, body = await self._get(w, f"/debug/{view}", timeout, params)
            except (aiohttp.ClientError, TimeoutError) as exc:
                status, ctype = 502, "application/json"
                body = json.dumps({"error": f"worker {w.index}: {exc!r}"}).encode()
            headers = {"Content-Type": ctype, WORKER_HEADER: str(w.index)}
            answer = web.Response(status=status, body=body, headers=headers)
            if status != 404:
                break
        assert answer is not None
        return answer
