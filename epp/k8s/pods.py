"""Pods → endpoints (spec §6.5).

A pod is an endpoint source when it is in the pool's namespace, its labels match the pool's
selector, its ``Ready`` condition is ``True``, it is not terminating (no
``metadata.deletionTimestamp``) and it has an IP. Each target port is a separate endpoint:

    id      <namespace>/<pod>-rank-<i>     (i = index of the port in targetPorts)
    address status.podIP,  port = targetPorts[i],  rank = i,  labels = the pod's labels

The annotation ``llm-d.ai/active-ports`` (legacy ``inference.networking.k8s.io/active-ports``)
is a comma-separated port list: only listed ports that are also target ports become endpoints
(ranks keep their target-port index). Without it every target port is active. Each entry is read
as upstream's ``fmt.Sscanf("%d")`` reads it after trimming spaces: an optional sign and the
leading decimal digits (``8000abc`` is 8000); entries without leading digits, and numbers that are
not positive, are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from epp.k8s.meta import DecodeError, mapping, metadata, string_map
from epp.k8s.pool import EndpointPool
from epp.plugin import Endpoint

ACTIVE_PORTS: Final = "llm-d.ai/active-ports"
LEGACY_ACTIVE_PORTS: Final = "inference.networking.k8s.io/active-ports"
_LEADING_INT: Final = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True, slots=True)
class PodInfo:
    name: str
    namespace: str
    ip: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    ready: bool
    terminating: bool


def decode_pod(obj: Any) -> PodInfo:
    namespace, name, meta = metadata(obj)
    try:
        raw_status = obj.get("status")
        status = mapping({} if raw_status is None else raw_status, "status")
        conditions = status.get("conditions")
        conditions = [] if conditions is None else conditions
        if not isinstance(conditions, list):
            raise DecodeError("status.conditions: expected a list")
        ready = any(
            isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
            for c in conditions
        )
        ip = status.get("podIP") or ""
        if not isinstance(ip, str):
            raise DecodeError("status.podIP: expected a string")
        return PodInfo(
            name=name,
            namespace=namespace,
            ip=ip,
            labels=string_map(meta.get("labels"), "metadata.labels"),
            annotations=string_map(meta.get("annotations"), "metadata.annotations"),
            ready=ready,
            terminating=meta.get("deletionTimestamp") is not None,
        )
    except DecodeError as exc:
        raise DecodeError(f"Pod {namespace}/{name}: {exc}") from None


def active_ports(annotations: Mapping[str, str]) -> frozenset[int] | None:
    """Ports listed by the active-ports annotation (new name first), or None when absent."""
    text = annotations.get(ACTIVE_PORTS)
    if text is None:
        text = annotations.get(LEGACY_ACTIVE_PORTS)
    if text is None:
        return None
    ports = (_LEADING_INT.match(entry.strip()) for entry in text.split(","))
    return frozenset(p for p in (int(m.group()) for m in ports if m) if p > 0)


def pod_endpoints(pod: PodInfo, pool: EndpointPool) -> list[Endpoint]:
    if (
        pod.namespace != pool.namespace
        or not pod.ready
        or pod.terminating
        or not pod.ip
        or not pool.selector.matches(pod.labels)
    ):
        return []
    active = active_ports(pod.annotations)
    return [
        Endpoint(
            id=f"{pod.namespace}/{pod.name}-rank-{rank}",
            name=f"{pod.name}-rank-{rank}",
            namespace=pod.namespace,
            address=pod.ip,
            port=port,
            rank=rank,
            labels=dict(pod.labels),
        )
        for rank, port in enumerate(pool.target_ports)
        if active is None or port in active
    ]


def pool_endpoints(pods: Iterable[PodInfo], pool: EndpointPool | None) -> list[Endpoint]:
    """Every endpoint of the pool, pods ordered by name (no pool: no endpoints)."""
    if pool is None:
        return []
    out: list[Endpoint] = []
    for pod in sorted(pods, key=lambda p: p.name):
        out.extend(pod_endpoints(pod, pool))
    return out
