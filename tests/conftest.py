"""Shared fixtures: one place for EPP Apps, simulated model servers, Envoy and ext_proc clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from google.protobuf import struct_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.app import App
from epp.plugin import Endpoint
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry
from epp.server import extproc_rpc
from epp.settings import Settings
from epp_tools.stack.envoy import Envoy
from epp_tools.stack.redis import RedisServer

TEST_PLUGINS = Path(__file__).parent / "fixtures" / "epp-testplugins"
CLOCK_STEP = 0.001
"""uvloop's ``loop.time()`` counts whole milliseconds: a timer fires when that clock reaches its
time, rounded, which can read up to half a millisecond (or a float's hair) below the time given.
A test comparing the loop clock with a timer's time allows this much."""

os.environ.setdefault("NO_PROXY", "*")

_HELD: list[socket.socket] = []  # bound, never listening: connections to them are refused


def dead_ports(n: int) -> list[int]:
    """``n`` loopback ports that refuse connections for the whole test run: each is bound by a
    socket this process holds and never listens on, so no other process can take it."""
    ports = []
    for _ in range(n):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        _HELD.append(sock)
        ports.append(sock.getsockname()[1])
    return ports


def endpoints_yaml(ports: Sequence[int], *, labels: dict[int, dict[str, str]] | None = None) -> str:
    """A file-discovery document: pod i listens on 127.0.0.1:ports[i], named pod-i."""
    lines = ["endpoints:"]
    for i, port in enumerate(ports):
        lines += [
            f"- name: pod-{i}",
            "  namespace: default",
            "  address: 127.0.0.1",
            f"  port: '{port}'",
        ]
        if labels and i in labels:
            lines.append("  labels:")
            lines += [f"    {k}: '{v}'" for k, v in labels[i].items()]
    return "\n".join(lines) + "\n"


def epp_config(endpoints_file: Path, body: str = "") -> str:
    """An EndpointPickerConfig with file discovery; ``body`` holds plugins/profiles (YAML). A body
    with its own top-level ``dataLayer:`` (2-space indented) gets the discovery added to it."""
    head = textwrap.dedent("""\
        apiVersion: llm-d.ai/v1alpha1
        kind: EndpointPickerConfig
        """)
    body = (
        textwrap.dedent(body)
        if body
        else textwrap.dedent("""\
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        - type: prefix-cache-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: queue-scorer
            weight: 2
          - pluginRef: kv-cache-utilization-scorer
            weight: 2
          - pluginRef: prefix-cache-scorer
            weight: 3
        """)
    )
    discovery = textwrap.dedent(f"""\
        - type: file-discovery
          parameters:
            path: {endpoints_file}
            watchFile: true
            pollInterval: 100ms
        """)
    if "plugins:" in body.split("schedulingProfiles:")[0]:
        body = body.replace("plugins:\n", "plugins:\n" + discovery, 1)
    else:
        body = "plugins:\n" + discovery + body
    lines = body.split("\n")
    if "dataLayer:" in lines:
        lines.insert(lines.index("dataLayer:") + 1, "  discovery: {pluginRef: file-discovery}")
        return head + "\n".join(lines)
    return head + body + "dataLayer:\n  discovery: {pluginRef: file-discovery}\n"


def registry_with_test_plugins() -> PluginRegistry:
    """The installed plugins plus the fixture package's, without installing it."""
    import sys
    from importlib import metadata

    if str(TEST_PLUGINS) not in sys.path:
        sys.path.insert(0, str(TEST_PLUGINS))
    base = PluginRegistry.from_entry_points()
    extra = [
        PluginInfo(
            t,
            f"epp_testplugins:{cls}",
            "epp-testplugins",
            "0.1.0",
            metadata.EntryPoint(t, f"epp_testplugins:{cls}", GROUP),
        )
        for t, cls in (
            ("test-constant-scorer", "ConstantScorer"),
            ("test-raising-scorer", "RaisingScorer"),
            ("test-raising-filter", "RaisingFilter"),
            ("test-header-setter", "HeaderSetter"),
        )
    ]
    return PluginRegistry([base.info(t) for t in base.types()] + extra)


def make_settings(config_text: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "grpc_port": 0,
        "grpc_health_port": 0,
        "metrics_port": 0,
        "bind_address": "127.0.0.1",
        "secure_serving": False,
        "drain_timeout": 0.0,
        "config_text": config_text,
        "seed": 7,
    }
    base.update(overrides)
    return Settings(**base)


@pytest.fixture
async def start_app(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """``await start_app(ports, config_body=..., **settings)`` → a running, ready App."""
    stack = contextlib.AsyncExitStack()

    async def start(
        ports: Sequence[int],
        config_body: str = "",
        *,
        ready: bool = True,
        labels: dict[int, dict[str, str]] | None = None,
        registry: PluginRegistry | None = None,
        **overrides: Any,
    ) -> App:
        ep_file = tmp_path / f"endpoints-{len(stack._exit_callbacks)}.yaml"
        ep_file.write_text(endpoints_yaml(ports, labels=labels))
        app = App(make_settings(epp_config(ep_file, config_body), **overrides), registry=registry)
        await stack.enter_async_context(app)
        app.endpoints_file = ep_file  # type: ignore[attr-defined]
        if ready:
            await app.wait_ready(60)  # bounds a failure only; a busy machine is slow
        return app

    yield start
    await stack.aclose()


@pytest.fixture
async def sim_pods() -> AsyncIterator[Callable[..., Any]]:
    """``await sim_pods(n, **podconfig)`` → a started SimFleet of n pods on free ports."""
    from epp_tools.sim.config import PodConfig
    from epp_tools.sim.fleet import SimFleet

    stack = contextlib.AsyncExitStack()

    async def start(n: int, **kw: Any) -> SimFleet:
        kw.setdefault("time_scale", 50.0)
        fleet = SimFleet([PodConfig(name=f"pod-{i}", **kw) for i in range(n)])
        await stack.enter_async_context(fleet)
        return fleet

    yield start
    await stack.aclose()


async def set_overrides(url: str, **values: Any) -> None:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/sim/overrides", json=values) as r:
        assert r.status == 200, await r.text()


async def wait_for(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    # the timeout only bounds a failure: generous, so a busy machine does not fail a test
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


# ---- direct ext_proc client ---------------------------------------------------------------------


def headers_msg(
    headers: dict[str, str], *, end_of_stream: bool = False, subset: list[str] | None = None
) -> pb.ProcessingRequest:
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=pb.HeaderMap(
                headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
            ),
            end_of_stream=end_of_stream,
        )
    )
    if subset is not None:
        st = struct_pb2.Struct()
        st.update({"x-gateway-destination-endpoint-subset": subset})
        msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(st)
    return msg


def body_msg(body: bytes, *, end_of_stream: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=end_of_stream))


async def exchange(
    app: App, messages: Sequence[pb.ProcessingRequest], timeout: float = 30.0
) -> list[pb.ProcessingResponse]:
    """Send ``messages`` on one ext_proc stream, half-close, collect every reply."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:

        async def gen() -> AsyncIterator[pb.ProcessingRequest]:
            for m in messages:
                yield m

        out = []
        async with asyncio.timeout(timeout):
            async for reply in extproc_rpc.process(ch)(gen()):
                out.append(reply)
        return out


def set_headers_of(reply: pb.ProcessingResponse) -> dict[str, str]:
    common = reply.request_headers.response
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


# ---- Envoy and HTTP helpers -------------------------------------------------------------------

COMPLETION = {"model": "sim-model", "prompt": "hello there", "max_tokens": 4}


@pytest.fixture
def envoy() -> Iterator[Callable[..., Envoy]]:
    started: list[Envoy] = []

    def start(app: Any, config: str = "full-duplex", **kw: Any) -> Envoy:
        e = Envoy(config, epp_port=app.grpc_port, epp_tls=app.settings.secure_serving, **kw)
        started.append(e.start())
        return e

    yield start
    for e in started:
        e.stop()


async def post(
    url: str,
    body: bytes | dict[str, Any],
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=hdrs) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


async def settle(app: Any, pred: Callable[[dict[int, Any]], bool]) -> None:
    """Wait until the EPP has scraped values satisfying ``pred`` (port → Metrics)."""
    await wait_for(lambda: pred({e.port: e.metrics for e in app.store.snapshot()}))


async def metrics_text(app: Any) -> str:
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as r,
    ):
        return await r.text()


# ---- bare /metrics servers (data-layer tests) ------------------------------------------------


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


# ---- redis-server (cross-replica state) -------------------------------------------------------


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``redis_server(*extra_args, tls=None, port=0)`` → a started ``RedisServer`` (on a free
    port unless given)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    started: list[RedisServer] = []

    def start(*args: str, tls: tuple[Path, Path, Path] | None = None, port: int = 0) -> RedisServer:
        workdir = tmp_path / f"redis-{len(started)}"
        workdir.mkdir()
        server = RedisServer(workdir, args=args, tls=tls, port=port)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()
