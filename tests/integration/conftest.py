"""The tests of the servers that drive their transports themselves (the ext_proc server's, the
simulator's gRPC server) run on both event loops: uvloop, the EPP's default (``epp.eventloop``),
and asyncio's own; the other integration tests on asyncio's, as the unit tests do (the tests that
start ``epp`` as a process run it on its default)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

BOTH_LOOPS = frozenset(
    {
        "test_h2_server.py",
        "test_h2_attacks.py",
        "test_extproc_stream.py",
        "test_extproc_misuse.py",
        "test_sim_grpc_sglang.py",  # the simulator's gRPC server, a protocol of its own
    }
)


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    if item.path.name in BOTH_LOOPS:
        return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}
