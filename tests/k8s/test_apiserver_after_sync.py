"""The API server misbehaving after the EPP synced: revoked credentials (401), a server that
stops answering, one that goes away. The EPP keeps routing from what it last saw, stays ready,
says what happened in its logs, and follows the cluster again once the server is back."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from epp.app import App
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import PODS, POOLS, pod, pool
from tests.conftest import wait_for
from tests.k8s.conftest import MODEL_LABELS, POOL

KNOWN = ["default/vllm-a-rank-0", "default/vllm-b-rank-0"]


def ids(app: App) -> list[str]:
    return sorted(e.id for e in app.store.snapshot())


def pod_errors(app: App) -> int:
    return sum(r.stats.errors for r in app.kube.reflectors.values())


async def routed_to(app: App) -> str:
    request = app.director.new_request({":path": "/v1/completions"})
    body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 4}).encode()
    decision = await app.director.decide(request, body, {})
    return decision.destination


async def _break(server: LocalApiServer, how: str) -> None:
    if how == "unauthorized":
        server.token = "revoked"  # the EPP's token is refused from its next request on
        server.drop_watches()
    elif how == "hanging":
        server.drop_watches()
        server.hang()
    else:
        server.stop()


def _mend(server: LocalApiServer, how: str, token: str) -> None:
    if how == "unauthorized":
        server.token = token
    elif how == "hanging":
        server.release()
    else:
        server.start()


@pytest.mark.parametrize("how", ["unauthorized", "hanging", "gone"])
async def test_routing_goes_on_from_the_last_state_and_resumes_when_the_server_is_back(
    apiserver: LocalApiServer, kube_app: Any, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.create(POOLS, pool(POOL, MODEL_LABELS, (8000,)))
    apiserver.create(PODS, pod("vllm-a", "127.0.0.2", MODEL_LABELS))
    apiserver.create(PODS, pod("vllm-b", "127.0.0.3", MODEL_LABELS))
    app = await kube_app(apiserver)
    assert ids(app) == KNOWN
    token, errors = apiserver.token, pod_errors(app)
    with caplog.at_level(logging.WARNING, logger="epp.k8s"):
        await _break(apiserver, how)
        if how != "hanging":  # a hanging server answers nothing, so nothing fails yet
            await wait_for(lambda: pod_errors(app) > errors, 10)
            assert "failed" in caplog.text
        for _ in range(5):
            assert await routed_to(app) in ("127.0.0.2:8000", "127.0.0.3:8000")
        assert app.ready() and ids(app) == KNOWN
        _mend(apiserver, how, token)
    apiserver.create(PODS, pod("vllm-c", "127.0.0.4", MODEL_LABELS))
    await wait_for(lambda: "default/vllm-c-rank-0" in ids(app), 20)
    assert app.ready()
