"""The metrics port: Prometheus ``/metrics`` plus read-only debug views.

- ``/metrics``: this App's registry (no process-global collectors, so two Apps never mix).
- ``/debug/config``: the effective configuration after defaulting.
- ``/debug/endpoints``: the endpoints with their last scraped metrics and scrape age.
- ``/debug/plugins/state``: what ``StateDumper`` plugins report (upstream's path).
- ``/debug/decisions[?limit=N]`` and ``/debug/decisions/<request id>``: the explain view of
  recent routing decisions (``epp.observability.decisions``).
- ``/debug/pprof/`` (Go's index of the profiles), ``/debug/pprof/profile`` and
  ``/debug/pprof/cmdline`` with ``--enable-pprof`` (``epp.observability.profile``).
- ``/debug/runtime``: the process's asyncio tasks (on the App's event loop), open file
  descriptors, threads and RSS, for leak hunting (``epp bench soak`` samples it); with
  ``?heap=1`` the C allocator's view, and under ``PYTHONTRACEMALLOC`` traced bytes and
  allocation-site diffs (``?tracemalloc=baseline|diff``; ``epp.observability.memory``).

``--enable-debug-endpoints=false`` serves ``/metrics`` alone. With ``--metrics-endpoint-auth``
every path goes through the reviewer's middleware (``epp.observability.auth``); with
``--metrics-cert-dir`` the port speaks TLS (``ssl_context``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from epp.observability import profile
from epp.observability.auth import Reviewer, auth_middleware
from epp.observability.decisions import DecisionLog
from epp.observability.memory import DEFAULT_TOP, MemoryDebug
from epp.plugin import Endpoint, StateDumper


@dataclass(frozen=True)
class DebugViews:
    """What the metrics port shows, each read when asked for."""

    registry: CollectorRegistry
    config: Callable[[], Mapping[str, Any]]
    endpoints: Callable[[], Sequence[Endpoint]]
    decisions: DecisionLog
    dumpers: Sequence[StateDumper]


@dataclass(frozen=True)
class PortOptions:
    """How the metrics port is served."""

    reviewer: Reviewer | None = None
    """``None``: no authentication."""
    ssl_context: ssl.SSLContext | None = None
    debug: bool = True
    pprof: bool = False


class MetricsServer:
    def __init__(self, views: DebugViews, options: PortOptions | None = None) -> None:
        self._views = views
        self._options = options or PortOptions()
        self._runner: web.AppRunner | None = None
        self._memory = MemoryDebug()

    async def start(self, host: str, port: int) -> int:
        o = self._options
        web_app = web.Application(
            middlewares=[auth_middleware(o.reviewer)] if o.reviewer is not None else []
        )
        web_app.router.add_get("/metrics", self._metrics)
        if o.debug:
            web_app.router.add_get("/debug/config", self._config)
            web_app.router.add_get("/debug/endpoints", self._endpoints)
            web_app.router.add_get("/debug/plugins/state", self._state)
            web_app.router.add_get("/debug/decisions", self._decisions)
            web_app.router.add_get("/debug/decisions/{request_id}", self._decision)
            web_app.router.add_get("/debug/runtime", self._runtime)
            if o.pprof:
                web_app.router.add_get("/debug/pprof", profile.to_index)
                web_app.router.add_get("/debug/pprof/", profile.index)
                web_app.router.add_get("/debug/pprof/cmdline", profile.cmdline)
                web_app.router.add_get("/debug/pprof/profile", profile.Profiler().profile)
        self._runner = web.AppRunner(web_app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=o.ssl_context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        return int(sockets[0].getsockname()[1]) if sockets else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._views.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _config(self, _: web.Request) -> web.Response:
        return web.json_response(dict(self._views.config()))

    async def _endpoints(self, _: web.Request) -> web.Response:
        now = time.monotonic()
        out: list[dict[str, Any]] = []
        for e in self._views.endpoints():
            item: dict[str, Any] = {"id": e.id, "address": e.hostport, "labels": dict(e.labels)}
            if e.metrics is not None:
                m = asdict(e.metrics)
                m["active_models"] = sorted(e.metrics.active_models)
                m["waiting_models"] = sorted(e.metrics.waiting_models)
                m["age_seconds"] = now - e.metrics.update_time if e.metrics.update_time else None
                item["metrics"] = m
            out.append(item)
        return web.json_response({"endpoints": out}, dumps=_dumps)

    async def _decisions(self, request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            return web.json_response({"error": "limit must be an integer"}, status=400)
        return web.json_response({"decisions": self._views.decisions.latest(limit)})

    async def _decision(self, request: web.Request) -> web.Response:
        entry = self._views.decisions.get(request.match_info["request_id"])
        if entry is None:
            return web.json_response(
                {"error": "no decision recorded for that request id"}, status=404
            )
        return web.json_response(entry)

    async def _state(self, _: web.Request) -> web.Response:
        state = {str(p.typed_name): dict(p.dump_state()) for p in self._views.dumpers}
        return web.json_response(state, dumps=_dumps)

    async def _runtime(self, request: web.Request) -> web.Response:
        out: dict[str, Any] = dict(runtime_stats())
        query = request.query
        traced = self._memory.summary()
        if traced is not None:
            out["tracemalloc"] = traced
        if "gc" in query:
            out["gc"] = self._memory.gc(collect=query["gc"] == "collect")
        if "pymalloc" in query:
            out["pymalloc"] = self._memory.pymalloc()
        if "heap" in query:
            heap = self._memory.heap(trim=query["heap"] == "trim")
            if heap is not None:
                out["heap"] = heap
                out["rssBytes"] = runtime_stats()["rssBytes"]
        if "tracemalloc" in query:
            try:
                top = int(query.get("top", DEFAULT_TOP))
                found = await asyncio.to_thread(self._memory.command, query["tracemalloc"], top)
            except ValueError as exc:
                return web.json_response({"error": str(exc)}, status=400)
            out["tracemalloc"] = {**out.get("tracemalloc", {}), **found}
        return web.json_response(out)


def runtime_stats() -> dict[str, int]:
    """asyncio tasks of the running loop, open descriptors, threads and RSS of this process
    (``-1`` where ``/proc`` does not tell)."""
    out = {"asyncioTasks": len(asyncio.all_tasks()), "openFds": -1, "threads": -1, "rssBytes": -1}
    with contextlib.suppress(OSError):
        out["openFds"] = len(os.listdir("/proc/self/fd"))
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                out["rssBytes"] = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
    return out


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)
