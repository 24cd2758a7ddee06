"""One EPP per test for the fuzz tests: built-in default config plus every parser, a small body
limit (256 KiB) and gRPC message limit (1 MiB), endpoints on closed loopback ports (their scrapes
fail fast; routing works)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from epp.app import App
from epp_tools.bench.fuzz.gen import Spec
from epp_tools.bench.fuzz.run import fuzz_config_body
from tests.conftest import dead_ports

DEAD = tuple(dead_ports(3))


@dataclass
class FuzzTarget:
    app: App
    channel: grpc.aio.Channel
    spec: Spec


@pytest.fixture
async def fuzz_target(start_app: Callable[..., Any]) -> AsyncIterator[FuzzTarget]:
    app = await start_app(
        list(DEAD),
        fuzz_config_body(),
        max_request_body_bytes=256 << 10,
        grpc_max_recv_msg_size=1 << 20,
    )
    spec = Spec(pool=tuple(f"127.0.0.1:{p}" for p in DEAD), served_models=("m",))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        yield FuzzTarget(app, channel, spec)
