"""KubernetesSource readiness: the pool's appProtocol against the parsers' (spec §10)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from epp.k8s.pool import decode_pool
from epp.k8s.sink import ObjectSink
from epp.k8s.source import KubernetesSource, PoolMode
from epp.plugin import APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP
from epp.plugins.parsers.openai import OpenAIParser
from epp.plugins.parsers.passthrough import PassthroughParser
from epp_tools.bench.kube.objects import pool

BOTH = (APP_PROTOCOL_H2C, APP_PROTOCOL_HTTP)


def _source(protocols: dict[str, tuple[str, ...]]) -> KubernetesSource:
    src = KubernetesSource(
        api=Any,  # type: ignore[arg-type]  # never called: no reflectors are built
        mode=PoolMode(name="p", namespace="default", group="inference.networking.k8s.io"),
        publish=lambda endpoints: None,
        sink=ObjectSink.__new__(ObjectSink),
        parser_protocols=protocols,
    )
    src._expected = {"pods", "pool"}
    return src


async def _deliver(src: KubernetesSource, app_protocol: str) -> None:
    obj = pool("p", {"app": "vllm"}, app_protocol=app_protocol)
    src._update("pods", {})
    src._update("pool", {"default/p": decode_pool(obj)})
    await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("app_protocol", "protocols", "ready"),
    [
        pytest.param("", {"a": (APP_PROTOCOL_H2C,)}, True, id="unset"),
        pytest.param(APP_PROTOCOL_HTTP, {"a": BOTH}, True, id="http-served"),
        pytest.param(APP_PROTOCOL_HTTP, {"a": BOTH, "g": (APP_PROTOCOL_H2C,)}, False, id="h2c"),
        pytest.param(APP_PROTOCOL_H2C, {"g": (APP_PROTOCOL_H2C,), "p": ()}, True, id="empty-any"),
    ],
)
async def test_readiness_follows_the_pool_protocol_when_parsers_declare_theirs(
    app_protocol: str, protocols: dict[str, tuple[str, ...]], ready: bool, caplog: Any
) -> None:
    src = _source(protocols)
    with caplog.at_level(logging.ERROR):
        await _deliver(src, app_protocol)
    assert src.ready() is ready
    assert ("parser does not support the pool protocol" in caplog.text) is not ready


def test_builtin_parsers_declare_upstream_protocols_when_asked() -> None:
    assert OpenAIParser(name="o", params=None, handle=None).app_protocols() == BOTH
    assert not hasattr(PassthroughParser(name="p", params=None, handle=None), "app_protocols")


async def test_stopping_while_the_watches_wind_down_after_losing_the_lease_ends_the_run() -> None:
    """The lease is lost, and the App stops while the watches' threads are still being joined:
    the run ends (its cancellation was once swallowed, and the run looped forever)."""
    src = _source({})
    leading = [True]
    src.leading = (lambda: leading[0], 0.01)
    watching, joining = asyncio.Event(), asyncio.Event()

    async def watch_all() -> None:  # the threads' join takes a while once cancelled
        try:
            watching.set()
            await asyncio.Event().wait()
        finally:
            joining.set()
            await asyncio.sleep(0.2)

    src._watch_all = watch_all  # type: ignore[method-assign]
    src._forget = lambda: None  # type: ignore[method-assign]
    run = asyncio.create_task(src.run())
    await asyncio.wait_for(watching.wait(), 5)
    leading[0] = False  # lost: the watches are cancelled and joined
    await asyncio.wait_for(joining.wait(), 5)
    run.cancel()  # the App stops meanwhile
    done, _ = await asyncio.wait({run}, timeout=5)
    assert run in done and run.cancelled()
