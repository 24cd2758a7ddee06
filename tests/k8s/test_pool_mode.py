"""InferencePool and standalone modes against the test API server, through the App."""

from __future__ import annotations

from typing import Any

import pytest

from epp.app import App
from epp_tools.bench.kube.apiserver import Fault, LocalApiServer
from epp_tools.bench.kube.objects import PODS, POOLS, pod, pool
from tests.conftest import wait_for
from tests.k8s.conftest import MODEL_LABELS, POOL


def ids(app: App) -> list[str]:
    return sorted(e.id for e in app.store.snapshot())


async def until(app: App, expected: list[str], timeout: float = 5.0) -> None:
    try:
        await wait_for(lambda: ids(app) == sorted(expected), timeout)
    except TimeoutError:
        raise AssertionError(f"endpoints {ids(app)} never became {sorted(expected)}") from None


def seed(server: LocalApiServer, *pods: tuple[str, str], ports: tuple[int, ...] = (8000,)) -> None:
    server.create(POOLS, pool(POOL, MODEL_LABELS, ports))
    for name, ip in pods:
        server.create(PODS, pod(name, ip, MODEL_LABELS))


async def test_endpoints_follow_pods_when_pods_come_and_go(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"))
    app = await kube_app(apiserver)
    assert ids(app) == ["default/vllm-a-rank-0"]
    endpoint = app.store.get("default/vllm-a-rank-0")
    assert endpoint is not None
    assert (endpoint.address, endpoint.port, endpoint.rank, endpoint.name) == (
        "127.0.0.2",
        8000,
        0,
        "vllm-a-rank-0",
    )
    assert endpoint.labels == MODEL_LABELS

    apiserver.create(PODS, pod("vllm-b", "127.0.0.3", MODEL_LABELS))
    apiserver.create(PODS, pod("other", "127.0.0.4", {"app": "other"}))
    await until(app, ["default/vllm-a-rank-0", "default/vllm-b-rank-0"])
    apiserver.delete(PODS, "vllm-a")
    await until(app, ["default/vllm-b-rank-0"])
    assert app.ready()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({"ready": False}, [], id="not-ready"),
        pytest.param({"terminating": True}, [], id="terminating"),
        pytest.param({"ip": ""}, [], id="no-ip-yet"),
        pytest.param({"labels": {"app": "other"}}, [], id="labels-no-longer-match"),
        pytest.param(
            {"annotations": {"llm-d.ai/active-ports": "8001"}},
            ["default/vllm-a-rank-1"],
            id="active-ports-annotation",
        ),
        pytest.param(
            {"annotations": {"inference.networking.k8s.io/active-ports": "8000, 9999"}},
            ["default/vllm-a-rank-0"],
            id="legacy-active-ports-annotation",
        ),
    ],
)
async def test_pod_endpoints_change_when_the_pod_changes(
    apiserver: LocalApiServer, kube_app: Any, change: dict[str, Any], expected: list[str]
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"), ports=(8000, 8001))
    app = await kube_app(apiserver)
    assert ids(app) == ["default/vllm-a-rank-0", "default/vllm-a-rank-1"]
    args: dict[str, Any] = {"name": "vllm-a", "ip": "127.0.0.2", "labels": MODEL_LABELS}
    args.update(change)
    apiserver.replace(PODS, pod(**args))
    await until(app, expected)
    args = {"name": "vllm-a", "ip": "127.0.0.2", "labels": MODEL_LABELS}
    apiserver.replace(PODS, pod(**args))  # back to Ready, all ports
    await until(app, ["default/vllm-a-rank-0", "default/vllm-a-rank-1"])


async def test_deleted_pod_vanishes_when_the_watch_resumes_with_410(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"), ("vllm-b", "127.0.0.3"))
    app = await kube_app(apiserver)
    assert ids(app) == ["default/vllm-a-rank-0", "default/vllm-b-rank-0"]
    lists_before = apiserver.count("pods", watch=False)
    apiserver.fail(Fault(status=503, path_contains="/pods", watch=True))
    apiserver.drop_watches()
    await wait_for(lambda: apiserver.count("pods", watch=True) >= 3, 10)  # retried, refused
    apiserver.delete(PODS, "vllm-a")  # while no watch is connected
    apiserver.compact()
    apiserver.clear_faults()
    await until(app, ["default/vllm-b-rank-0"], timeout=15)
    pods = app.kube.reflectors["pods"]
    assert pods.stats.gone >= 1
    assert apiserver.count("pods", watch=False) > lists_before  # relisted after the 410
    assert app.ready()


async def test_endpoints_follow_the_selector_when_the_pool_selector_changes(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"))
    apiserver.create(PODS, pod("sglang-a", "127.0.0.5", {"app": "sglang"}))
    app = await kube_app(apiserver)
    assert ids(app) == ["default/vllm-a-rank-0"]
    current = apiserver.get(POOLS, POOL)
    current["spec"]["selector"]["matchLabels"] = {"app": "sglang"}
    current["spec"]["targetPorts"] = [{"number": 30000}, {"number": 30001}]
    apiserver.replace(POOLS, current)
    await until(app, ["default/sglang-a-rank-0", "default/sglang-a-rank-1"])
    assert {e.port for e in app.store.snapshot()} == {30000, 30001}


async def test_readiness_waits_for_the_first_sync_when_the_api_server_fails(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"))
    apiserver.fail(Fault(status=500, path_contains="/pods", watch=False))
    app = await kube_app(apiserver, ready=False)
    await wait_for(lambda: apiserver.count("pods", watch=False) >= 2, 10)
    assert not app.ready()
    assert ids(app) == []
    apiserver.clear_faults()
    await app.wait_ready(60)
    assert ids(app) == ["default/vllm-a-rank-0"]


async def test_readiness_turns_off_when_the_pool_is_deleted(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"))
    app = await kube_app(apiserver)
    apiserver.delete(POOLS, POOL)
    await until(app, [])
    assert not app.ready()
    apiserver.create(POOLS, pool(POOL, MODEL_LABELS))
    await app.wait_ready(60)
    assert ids(app) == ["default/vllm-a-rank-0"]


async def test_bad_objects_are_skipped_when_they_do_not_decode(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver, ("vllm-a", "127.0.0.2"))
    broken = pod("vllm-bad", "127.0.0.9", MODEL_LABELS)
    broken["metadata"]["labels"] = {"app": ["not", "a", "string"]}
    apiserver.create(PODS, broken)
    app = await kube_app(apiserver)
    assert ids(app) == ["default/vllm-a-rank-0"]
    garbage = pod("vllm-x", "127.0.0.8", MODEL_LABELS)
    garbage["status"] = "garbage"
    apiserver.create(PODS, garbage)
    apiserver.create(PODS, pod("vllm-b", "127.0.0.3", MODEL_LABELS))
    await until(app, ["default/vllm-a-rank-0", "default/vllm-b-rank-0"])
    assert app.kube.reflectors["pods"].stats.decode_errors >= 2


async def test_standalone_mode_watches_pods_only_when_given_a_selector(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    apiserver.create(PODS, pod("vllm-a", "127.0.0.2", {"app": "vllm", "role": "decode"}))
    apiserver.create(PODS, pod("vllm-p", "127.0.0.3", {"app": "vllm", "role": "prefill"}))
    app = await kube_app(
        apiserver,
        endpoint_selector="app=vllm,role in (decode,both)",
        endpoint_target_ports=(8000, 8002),
        pod_name="vllm-epp-5d8f9c-abcde",
    )
    assert ids(app) == ["default/vllm-a-rank-0", "default/vllm-a-rank-1"]
    assert app.kube.pool.name == "vllm-epp"
    assert set(app.kube.reflectors) == {"pods"}
    assert apiserver.count("inferencepools", watch=False) == 0
