"""InferenceObjective and InferenceModelRewrite from the cluster, end to end through the App."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from epp.app import App
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import (
    LEGACY_OBJECTIVES,
    LEGACY_REWRITES,
    OBJECTIVES,
    PODS,
    POOLS,
    REWRITES,
    objective,
    pod,
    pool,
    rewrite,
)
from tests.conftest import body_msg, exchange, headers_msg, metrics_text, wait_for
from tests.k8s.conftest import MODEL_LABELS, POOL

OBJECTIVE_HEADER = "x-llm-d-inference-objective"


def seed(server: LocalApiServer) -> None:
    server.create(POOLS, pool(POOL, MODEL_LABELS))
    server.create(PODS, pod("vllm-a", "127.0.0.2", MODEL_LABELS))
    server.create(PODS, pod("vllm-b", "127.0.0.3", MODEL_LABELS))


def priority(app: App, name: str) -> int:
    return app.director.new_request({OBJECTIVE_HEADER: name}).priority


def completion(model: str) -> bytes:
    return json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()


async def test_priority_follows_the_objective_when_its_priority_changes(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    apiserver.create(OBJECTIVES, objective("chat", POOL, 5))
    apiserver.create(OBJECTIVES, objective("unset", POOL))
    apiserver.create(OBJECTIVES, objective("elsewhere", "another-pool", 9))
    app = await kube_app(apiserver)
    assert [priority(app, n) for n in ("chat", "unset", "elsewhere", "missing")] == [5, 0, 0, 0]
    changed = apiserver.get(OBJECTIVES, "chat")
    changed["spec"]["priority"] = -3
    apiserver.replace(OBJECTIVES, changed)
    await wait_for(lambda: priority(app, "chat") == -3)
    apiserver.delete(OBJECTIVES, "chat")
    await wait_for(lambda: priority(app, "chat") == 0)


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        pytest.param((OBJECTIVES, LEGACY_OBJECTIVES), 7, id="both-groups-legacy-ignored"),
        pytest.param((LEGACY_OBJECTIVES,), 3, id="legacy-group-only"),
        pytest.param((), 0, id="no-objective-api"),
    ],
)
async def test_objective_group_is_chosen_when_groups_are_installed(
    kube_app: Any, installed: tuple[Any, ...], expected: int
) -> None:
    with LocalApiServer((PODS, POOLS, *installed), bookmark_interval=0.2) as server:
        seed(server)
        if OBJECTIVES in installed:
            server.create(OBJECTIVES, objective("batch", POOL, 7))
        if LEGACY_OBJECTIVES in installed:
            server.create(LEGACY_OBJECTIVES, objective("batch", POOL, 3))
        app = await kube_app(server)
        assert priority(app, "batch") == expected
        assert ("rewrites" in app.kube.reflectors) is False
        legacy_watched = any(
            r.path.startswith("/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/")
            for r in server.requests
        )
        assert legacy_watched == (installed == (LEGACY_OBJECTIVES,))


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        pytest.param((REWRITES, LEGACY_REWRITES), "new-group", id="both-groups-legacy-ignored"),
        pytest.param((LEGACY_REWRITES,), "legacy-group", id="legacy-group-only"),
    ],
)
async def test_rewrite_group_is_chosen_when_groups_are_installed(
    kube_app: Any, installed: tuple[Any, ...], expected: str
) -> None:
    with LocalApiServer((PODS, POOLS, *installed), bookmark_interval=0.2) as server:
        seed(server)
        for resource, target in ((REWRITES, "new-group"), (LEGACY_REWRITES, "legacy-group")):
            if resource in installed:
                rule = {"targets": [{"modelRewrite": target}]}
                server.create(resource, rewrite("all", POOL, [rule]))
        app = await kube_app(server)
        await wait_for(lambda: len(app.rewrites) == 1)
        request = app.director.new_request({":path": "/v1/completions"})
        await app.director.decide(request, completion("m"), {})
        assert request.target_model == expected


async def test_sheddable_objective_is_refused_when_the_pool_is_saturated(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    # The pods' metrics are never scraped (nothing listens on them), so the utilization detector
    # sees stale metrics: saturated. Only sheddable (priority < 0) requests are refused.
    seed(apiserver)
    apiserver.create(OBJECTIVES, objective("batch", POOL, -1))
    apiserver.create(OBJECTIVES, objective("chat", POOL, 1))
    app = await kube_app(apiserver)
    headers = {":path": "/v1/completions", "content-type": "application/json"}
    shed = await exchange(
        app, [headers_msg({**headers, OBJECTIVE_HEADER: "batch"}), body_msg(completion("m"))]
    )
    kept = await exchange(
        app, [headers_msg({**headers, OBJECTIVE_HEADER: "chat"}), body_msg(completion("m"))]
    )
    assert shed[0].immediate_response.status.code == 429
    assert b"sheddable request dropped" in shed[0].immediate_response.body
    destination = {
        h.header.key: h.header.raw_value.decode()
        for h in kept[0].request_headers.response.header_mutation.set_headers
    }["x-gateway-destination-endpoint"]
    assert destination in ("127.0.0.2:8000", "127.0.0.3:8000")


async def test_rewrite_splits_traffic_90_10_when_measured_over_2000_requests(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    rule = {
        "matches": [{"model": {"type": "Exact", "value": "llama"}}],
        "targets": [
            {"modelRewrite": "llama-v1", "weight": 90},
            {"modelRewrite": "llama-v2", "weight": 10},
        ],
    }
    apiserver.create(REWRITES, rewrite("canary", POOL, [rule]))
    app = await kube_app(apiserver, metrics_endpoint_auth=False)  # scraped below, no token
    await wait_for(lambda: len(app.rewrites) == 1)
    counts: Counter[str] = Counter()
    headers = {":path": "/v1/completions"}
    for _ in range(2000):
        request = app.director.new_request(headers)
        decision = await app.director.decide(request, completion("llama"), {})
        assert json.loads(decision.body)["model"] == request.target_model
        counts[request.target_model] += 1
    # binomial(2000, 0.1): sigma = 13.4; allow 4.5 sigma
    assert set(counts) == {"llama-v1", "llama-v2"}
    assert abs(counts["llama-v2"] - 200) <= 60
    text = await metrics_text(app)
    for family in ("llm_d_epp", "inference_extension"):
        line = (
            f'{family}_model_rewrite_decisions_total{{model_name="llama",'
            f'model_rewrite_name="canary",target_model="llama-v2"}} {float(counts["llama-v2"])}'
        )
        assert line in text


async def test_rewrite_overrides_the_header_when_a_rule_matches_the_incoming_model(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    generic = {"targets": [{"modelRewrite": "fallback"}]}
    exact = {
        "matches": [{"model": {"value": "old"}}],
        "targets": [{"modelRewrite": "new"}],
    }
    apiserver.create(
        REWRITES, rewrite("catch-all", POOL, [generic], created="2024-01-01T00:00:00Z")
    )
    apiserver.create(REWRITES, rewrite("rename", POOL, [exact], created="2025-01-01T00:00:00Z"))
    app = await kube_app(apiserver)
    await wait_for(lambda: len(app.rewrites) == 2)
    base = {":path": "/v1/completions", "content-type": "application/json"}
    replies = await exchange(
        app,
        [
            headers_msg({**base, "x-llm-d-model-name-rewrite": "from-header"}),
            body_msg(completion("old")),
        ],
    )
    assert json.loads(replies[1].request_body.response.body_mutation.streamed_response.body) == {
        "max_tokens": 4,
        "model": "new",
        "prompt": "hello",
    }
    request = app.director.new_request(base)
    await app.director.decide(request, completion("anything"), {})
    assert request.target_model == "fallback"
    apiserver.delete(REWRITES, "catch-all")
    await wait_for(lambda: len(app.rewrites) == 1)
    request = app.director.new_request({**base, "x-llm-d-model-name-rewrite": "from-header"})
    await app.director.decide(request, completion("anything"), {})
    assert request.target_model == "from-header"
