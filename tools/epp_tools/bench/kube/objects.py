"""Kubernetes objects as the API server returns them (pods, InferencePools, objectives,
rewrites), for the local API server of ``epp_tools.bench.kube.apiserver``."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any


def _now() -> str:
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
        metadata["deletionTimestamp"] = _now()
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
            "startTime": _now(),
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
