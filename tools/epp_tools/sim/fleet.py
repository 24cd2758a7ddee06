"""Many simulated pods in one process: the in-process API for tests and benchmarks.

Example::

    configs = [PodConfig(name=f"sim-{i}", time_scale=50.0) for i in range(4)]  # port 0 = free
    async with SimFleet(configs) as fleet:
        print(fleet.urls)            # ['http://127.0.0.1:40123', ...]
        runtime = fleet.runtime(0)   # engine, overrides, faults of pod 0

Each pod has its own engine, HTTP server (one listening socket on its own port) and, if
configured, its own ZMQ PUB socket; pods share the event loop and one ZMQ context.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import zmq
from aiohttp import web

from epp_tools.sim.config import PodConfig
from epp_tools.sim.grpcapi import handlers as grpc_handlers
from epp_tools.sim.grpcserver import SniffingSite
from epp_tools.sim.kvevents import KVEventPublisher
from epp_tools.sim.runtime import PodRuntime
from epp_tools.sim.server import build_app

_SHUTDOWN_TIMEOUT_S = 2.0
"""Seconds a stopping pod gives the requests it serves to finish (SIGTERM: a rolling restart)."""


@dataclass
class _Pod:
    runtime: PodRuntime
    runner: web.AppRunner
    port: int
    publisher: KVEventPublisher | None


class SimFleet:
    def __init__(self, configs: Sequence[PodConfig]) -> None:
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ValueError("pod names must be unique")
        self.configs = tuple(configs)
        self._pods: list[_Pod] = []
        self._zmq: zmq.Context[Any] | None = None

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def ports(self) -> list[int]:
        return [p.port for p in self._pods]

    @property
    def urls(self) -> list[str]:
        return [f"http://{_url_host(p.runtime.config.host)}:{p.port}" for p in self._pods]

    @property
    def runtimes(self) -> list[PodRuntime]:
        return [p.runtime for p in self._pods]

    def runtime(self, index: int) -> PodRuntime:
        return self._pods[index].runtime

    def kv_endpoint(self, index: int) -> str | None:
        """The concrete endpoint of pod ``index``'s publisher (useful with a ``*`` port)."""
        publisher = self._pods[index].publisher
        return publisher.bound_endpoint if publisher else None

    async def start(self) -> None:
        if self._pods:
            raise RuntimeError("the fleet is already started")
        try:
            for config in self.configs:
                self._pods.append(await self._start_pod(config))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """As a model server's graceful shutdown: stop accepting connections, let the requests
        being served finish (up to ``_SHUTDOWN_TIMEOUT_S``), then abort what is left."""
        pods, self._pods = self._pods, []
        for pod in pods:
            await pod.runner.cleanup()
            await pod.runtime.aclose()
            if pod.publisher is not None:
                pod.publisher.close()
        if self._zmq is not None:
            self._zmq.term()
            self._zmq = None

    async def _start_pod(self, config: PodConfig) -> _Pod:
        publisher: KVEventPublisher | None = None
        runner: web.AppRunner | None = None
        sock: socket.socket | None = None
        try:
            if config.kv_events_endpoint:
                if self._zmq is None:
                    self._zmq = zmq.Context()
                publisher = KVEventPublisher(
                    self._zmq, config.kv_events_endpoint, config.kv_events_topic
                )
            sock = socket.create_server((config.host, config.port), backlog=1024)
            port = int(sock.getsockname()[1])
            runtime = PodRuntime(config, publisher)
            runner = web.AppRunner(
                build_app(runtime, port), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S
            )
            await runner.setup()
            tags = [("x-sim-pod", config.name), ("x-sim-role", config.role)]
            site = SniffingSite(runner, sock, grpc_handlers(runtime), tags)
            sock = None  # the site owns the socket from here on and closes it on cleanup
            await site.start()
        except BaseException:
            if sock is not None:
                sock.close()
            if runner is not None:
                await runner.cleanup()
            if publisher is not None:
                publisher.close()
            raise
        return _Pod(runtime, runner, port, publisher)


def _url_host(host: str) -> str:
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
