"""The Kubernetes wire types of the local API server (``epp_tools.bench.kube.apiserver``): API
resources, ``Status`` errors, injected faults, recorded requests, label and field selectors and
the discovery documents."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

TOKEN = "test-token"


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


@dataclass
class Fault:
    """Answer matching requests with ``status`` (``remaining`` times; None = until cleared)."""

    status: int
    method: str = "GET"
    path_contains: str = ""
    watch: bool | None = None
    remaining: int | None = None


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass
class State:
    rv: int = 0
    compacted: int = 0
    objects: dict[tuple[Resource, str, str], dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, Resource, str, dict[str, Any]]] = field(default_factory=list)


def timestamp() -> str:
    """Now, as Kubernetes writes times (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.body = status(code, reason, message)


def matcher(query: dict[str, str]) -> Callable[[dict[str, Any]], bool]:
    fields = _pairs(query.get("fieldSelector", ""), {"metadata.name", "metadata.namespace"})
    labels = _pairs(query.get("labelSelector", ""), None)

    def match(obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        for (key, op), value in fields.items():
            actual = meta.get(key.split(".", 1)[1], "")
            if (actual == value) != (op == "="):
                return False
        obj_labels = meta.get("labels") or {}
        for (key, op), value in labels.items():
            if (obj_labels.get(key) == value) != (op == "="):
                return False
        return True

    return match


def _pairs(text: str, allowed: set[str] | None) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op = "!=" if "!=" in part else "="
        key, _, value = part.replace("==", "=").partition(op)
        if not _ or (allowed is not None and key not in allowed):
            raise ApiError(400, "BadRequest", f'unable to parse requirement: "{part}"')
        out[(key.strip(), op)] = value.strip()
    return out


def discovery(resources: Iterable[Resource], path: str) -> dict[str, Any]:
    """The discovery document at ``path`` (``/version``, ``/api``, ``/apis``, a group version)."""
    installed = sorted(resources, key=lambda r: (r.group, r.version, r.plural))
    if path == "/version":
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake"}
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        groups: dict[str, list[str]] = {}
        for r in installed:
            if r.group and r.version not in groups.setdefault(r.group, []):
                groups[r.group].append(r.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                    "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                }
                for g, vs in groups.items()
            ],
        }
    parts = path.strip("/").split("/")
    group_version = "/".join(parts[1:])
    resources = [r for r in installed if r.prefix == path.rstrip("/")]
    if not resources:
        raise ApiError(404, "NotFound", "the server could not find the requested resource")
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": r.plural,
                "singularName": r.kind.lower(),
                "namespaced": True,
                "kind": r.kind,
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
            }
            for r in resources
        ],
    }
