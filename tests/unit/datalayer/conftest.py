"""Real local HTTP servers standing in for model servers' ``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from epp.plugin import Endpoint


@dataclass
class MetricsServer:
    """Serves ``payload`` on ``/metrics`` at 127.0.0.1; behaviour can change while running.

    ``stall`` holds every request until the server closes; ``delays`` are consumed one per request
    (seconds to wait before answering); ``arrivals`` records the loop time of each request and
    ``peers`` the client port of each request (one port = one kept-alive connection).
    """

    payload: bytes = b""
    status: int = 200
    stall: bool = False
    delays: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    port: int = 0
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(asyncio.get_running_loop().time())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.peers.append(peer[1] if peer else -1)
        if self.stall:
            await self._release.wait()
        if self.delays:
            await asyncio.sleep(self.delays.pop(0))
        return web.Response(status=self.status, body=self.payload, content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def endpoint(self, name: str) -> Endpoint:
        return Endpoint(
            id=f"default/{name}",
            name=name,
            namespace="default",
            address="127.0.0.1",
            port=self.port,
        )


ServerFactory = Callable[..., Awaitable[MetricsServer]]


@pytest.fixture
async def metrics_server() -> AsyncIterator[ServerFactory]:
    """``await metrics_server(payload=..., status=..., stall=...)`` starts one more server."""
    servers: list[MetricsServer] = []

    async def start(**kwargs: Any) -> MetricsServer:
        server = MetricsServer(**kwargs)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()
