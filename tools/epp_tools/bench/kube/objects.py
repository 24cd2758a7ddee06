"""What the local API server (``epp_tools.bench.kube.apiserver``) holds: the API resources it
serves (``PODS``, ``POOLS``, ``LEASES``, the objectives and rewrites, with their legacy groups)
and Kubernetes objects as it returns them (pods, InferencePools, objectives, rewrites)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


PODS = Resource("", "v1", "pods", "Pod")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
POOLS = Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
OBJECTIVES = Resource("llm-d.ai", "v1alpha2", "inferenceobjectives", "InferenceObjective")
LEGACY_OBJECTIVES = Resource(
    "inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"
)
REWRITES = Resource("llm-d.ai", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite")
LEGACY_REWRITES = Resource(
    "inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"
)
DEFAULT_RESOURCES = (PODS, LEASES, POOLS, OBJECTIVES, REWRITES)


def timestamp() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(
    name: str,
    ip: str,
    labels: dict[str, str] | None = None,
    *,
    ready: bool = True,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
    terminating: bool = False,
) -> dict[str, Any]:
    """A Pod as the API server returns it (the fields the EPP reads, plus realistic noise)."""
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if terminating:
        metadata["deletionTimestamp"] = timestamp()
        metadata["deletionGracePeriodSeconds"] = 30
    return {
        "metadata": metadata,
        "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "ports": []}],
            "nodeName": "node-1",
        },
        "status": {
            "phase": "Running",
            "hostIP": "10.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "startTime": timestamp(),
        },
    }


def pool(
    name: str,
    selector: dict[str, str],
    ports: Iterable[int] = (8000,),
    *,
    app_protocol: str = "",
    namespace: str = "default",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": {"matchLabels": dict(selector)},
        "targetPorts": [{"number": p} for p in ports],
        "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}},
    }
    if app_protocol:
        spec["appProtocol"] = app_protocol
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def objective(
    name: str, pool_name: str, priority: int | None = None, *, namespace: str = "default"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"group": "inference.networking.k8s.io", "name": pool_name}}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def rewrite(
    name: str,
    pool_name: str,
    rules: list[dict[str, Any]],
    *,
    namespace: str = "default",
    created: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if created:
        meta["creationTimestamp"] = created
    return {
        "metadata": meta,
        "spec": {
            "poolRef": {"group": "inference.networking.k8s.io", "name": pool_name},
            "rules": rules,
        },
    }
