"""The Kubernetes scenarios on a real k3s API server (testcontainers).

They run wherever a Docker engine answers and are skipped, with the reason, where none does.
Model-server pods are bound to a Node object without a kubelet (``ghost-node``): nothing runs
them, and the test writes their status (IP in 127.0.0.0/8, Ready condition) itself, so no image
is pulled and no traffic leaves the machine. The CRDs are the development copies in
``deploy/kubernetes/crds``. The watch-dropped-then-410 scenario needs compaction on demand, which
only the test API server offers (``test_pool_mode.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import wait_for
from tests.k8s.conftest import (
    MODEL_LABELS,
    NOT_SERVING,
    POOL,
    health,
    leader_and_follower,
    start_kube_app,
    wait_serving,
)

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "crds"
GHOST_NODE = "ghost-node"
_namespaces = itertools.count(1)


def _docker_unavailable() -> str | None:
    try:
        import docker
        from testcontainers.community.k3s import K3SContainer  # noqa: F401
    except ImportError as exc:
        return f"testcontainers[k3s] is not installed ({exc.name})"
    try:
        docker.from_env(timeout=3).ping()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__})"
    return None


_REASON = _docker_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


class Cluster:
    """A k3s cluster with the CRDs installed, and object helpers for one namespace per test."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client

        from epp.k8s.client import load_api_client

        self.kubeconfig = kubeconfig
        self.api = load_api_client(str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.namespace = "default"

    def install(self) -> None:
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self.api)
        for path in sorted(CRDS.glob("*.yaml")):
            doc = yaml.safe_load(path.read_text())
            if doc.get("kind") == "CustomResourceDefinition":
                ext.create_custom_resource_definition(doc)
        self.core.create_node({"metadata": {"name": GHOST_NODE}})

    def new_namespace(self) -> str:
        self.namespace = f"epp-{next(_namespaces)}"
        self.core.create_namespace({"metadata": {"name": self.namespace}})
        return self.namespace

    def pod(self, name: str, ip: str, labels: dict[str, str], ready: bool = True) -> None:
        body = {
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeName": GHOST_NODE,
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai"}],
            },
        }
        self.core.create_namespaced_pod(self.namespace, body)
        self.set_ready(name, ip, ready)

    def set_ready(self, name: str, ip: str, ready: bool) -> None:
        status = "True" if ready else "False"
        self.core.patch_namespaced_pod_status(
            name,
            self.namespace,
            {
                "status": {
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": status}],
                }
            },
        )

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    def create(self, group: str, version: str, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(group, version, self.namespace, plural, body)

    def patch(self, group: str, version: str, plural: str, name: str, body: Any) -> None:
        self.custom.patch_namespaced_custom_object(
            group, version, self.namespace, plural, name, body
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    from testcontainers.community.k3s import K3SContainer

    with K3SContainer() as k3s:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(k3s.config_yaml())
        c = Cluster(path)
        c.install()
        yield c


@pytest.fixture
async def k3s_app(cluster: Cluster) -> AsyncIterator[Any]:
    stack = contextlib.AsyncExitStack()
    cluster.new_namespace()

    async def start(**kw: Any) -> Any:
        kw.setdefault("pool_namespace", cluster.namespace)
        return await start_kube_app(stack, cluster.kubeconfig, **kw)

    yield start
    await stack.aclose()


def seed(cluster: Cluster) -> None:
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": POOL},
        "spec": {"selector": {"matchLabels": MODEL_LABELS}, "targetPorts": [{"number": 8000}]},
    }
    cluster.create("inference.networking.k8s.io", "v1", "inferencepools", pool)
    cluster.pod("vllm-a", "127.0.0.2", MODEL_LABELS)


def ids(app: Any) -> list[str]:
    return sorted(e.id.split("/", 1)[1] for e in app.store.snapshot())


async def test_endpoints_follow_pods_when_pods_come_and_go_on_k3s(
    cluster: Cluster, k3s_app: Any
) -> None:
    seed(cluster)
    app = await k3s_app()
    assert ids(app) == ["vllm-a-rank-0"]
    cluster.pod("vllm-b", "127.0.0.3", MODEL_LABELS)
    await wait_for(lambda: ids(app) == ["vllm-a-rank-0", "vllm-b-rank-0"], 15)
    cluster.set_ready("vllm-a", "127.0.0.2", ready=False)
    await wait_for(lambda: ids(app) == ["vllm-b-rank-0"], 15)
    cluster.delete_pod("vllm-b")
    await wait_for(lambda: ids(app) == [], 15)
    cluster.set_ready("vllm-a", "127.0.0.2", ready=True)
    await wait_for(lambda: ids(app) == ["vllm-a-rank-0"], 15)


async def test_endpoints_follow_the_selector_when_the_pool_changes_on_k3s(
    cluster: Cluster, k3s_app: Any
) -> None:
    seed(cluster)
    cluster.pod("sglang-a", "127.0.0.4", {"app": "sglang"})
    app = await k3s_app()
    cluster.patch(
        "inference.networking.k8s.io",
        "v1",
        "inferencepools",
        POOL,
        {"spec": {"selector": {"matchLabels": {"app": "sglang"}}}},
    )
    await wait_for(lambda: ids(app) == ["sglang-a-rank-0"], 15)


async def test_priority_and_rewrites_follow_the_objects_on_k3s(
    cluster: Cluster, k3s_app: Any
) -> None:
    seed(cluster)
    ref = {"name": POOL}
    cluster.create(
        "llm-d.ai",
        "v1alpha2",
        "inferenceobjectives",
        {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": {"name": "chat"},
            "spec": {"priority": 5, "poolRef": ref},
        },
    )
    targets = [{"modelRewrite": "v1", "weight": 90}, {"modelRewrite": "v2", "weight": 10}]
    cluster.create(
        "llm-d.ai",
        "v1alpha2",
        "inferencemodelrewrites",
        {
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceModelRewrite",
            "metadata": {"name": "canary"},
            "spec": {
                "poolRef": ref,
                "rules": [{"matches": [{"model": {"value": "llama"}}], "targets": targets}],
            },
        },
    )
    app = await k3s_app()
    header = {"x-llm-d-inference-objective": "chat"}
    await wait_for(lambda: app.director.new_request(header).priority == 5, 15)
    cluster.patch("llm-d.ai", "v1alpha2", "inferenceobjectives", "chat", {"spec": {"priority": -1}})
    await wait_for(lambda: app.director.new_request(header).priority == -1, 15)
    await wait_for(lambda: len(app.rewrites) == 1, 15)
    counts: Counter[str] = Counter()
    body = json.dumps({"model": "llama", "prompt": "hi"}).encode()
    for _ in range(2000):
        request = app.director.new_request({":path": "/v1/completions"})
        await app.director.decide(request, body, {})
        counts[request.target_model] += 1
    assert abs(counts["v2"] - 200) <= 60


async def test_follower_takes_over_when_the_leader_is_killed_on_k3s(
    cluster: Cluster, epp_processes: Any
) -> None:
    namespace = cluster.new_namespace()
    seed(cluster)
    lease, renew, retry = 3.0, 2.0, 0.25
    procs = [
        epp_processes(cluster.kubeconfig, lease, renew, retry, namespace=namespace)
        for _ in range(2)
    ]
    (leader, _), (_, follower_port) = await leader_and_follower(procs, timeout=60)
    assert await health(follower_port) == NOT_SERVING
    leader.send_signal(signal.SIGKILL)
    elapsed = await wait_serving(follower_port, 20)
    assert elapsed <= lease + 2 * retry + 2.0
