"""The Istio ``EnvoyFilter`` that puts the EPP in front of a mesh's gateway (or a sidecar): the
ext_proc filter inserted before the router, the EPP cluster and the ORIGINAL_DST model-server
cluster added, and, given a route name, that route sent to the model-server cluster. The patch
values are the same typed messages the plain Envoy config is built from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from epp.envoyconfig.clusters import (
    FALLBACK_CLUSTER,
    POOL_CLUSTER,
    epp_cluster,
    pool_cluster,
    static_cluster,
)
from epp.envoyconfig.filters import http_filters
from epp.envoyconfig.options import EnvoyOptions
from epp.envoyconfig.render import as_dict
from epp.envoyconfig.retries import retry_policy

Context = Literal["GATEWAY", "SIDECAR_INBOUND", "SIDECAR_OUTBOUND"]
HCM = "envoy.filters.network.http_connection_manager"


@dataclass(frozen=True)
class IstioOptions:
    name: str = "epp-ext-proc"
    namespace: str = ""
    context: Context = "GATEWAY"
    selector: Mapping[str, str] = field(default_factory=dict)
    """workloadSelector labels (empty: every workload of the namespace)."""
    route: str = ""
    """Name of the HTTP route whose requests the EPP routes (sent to the model-server cluster);
    empty: no route patch (point your route at cluster ``pool`` yourself)."""


def _cluster_patch(context: Context, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "applyTo": "CLUSTER",
        "match": {"context": context},
        "patch": {"operation": "ADD", "value": value},
    }


def _route_value(opts: EnvoyOptions) -> dict[str, Any]:
    """The route patch: the model-server cluster and the retry policy."""
    value: dict[str, Any] = {"cluster": POOL_CLUSTER}
    policy = retry_policy(opts, other_hosts=bool(opts.pool))
    if policy is not None:
        value["retry_policy"] = as_dict(policy)
    return value


def envoy_filter(opts: EnvoyOptions, istio: IstioOptions) -> dict[str, Any]:
    """The EnvoyFilter object (networking.istio.io/v1alpha3)."""
    listener_match = {
        "filterChain": {"filter": {"name": HCM, "subFilter": {"name": "envoy.filters.http.router"}}}
    }
    patches = [
        {
            "applyTo": "HTTP_FILTER",
            "match": {"context": istio.context, "listener": listener_match},
            "patch": {"operation": "INSERT_BEFORE", "value": as_dict(f)},
        }
        for f in http_filters(opts)
        if f.name != "envoy.filters.http.router"
    ]
    clusters = [epp_cluster(opts), pool_cluster(opts)]
    if opts.fail_open:
        clusters.append(static_cluster(FALLBACK_CLUSTER, opts.fallback, opts=opts))
    patches += [_cluster_patch(istio.context, as_dict(c)) for c in clusters]
    if istio.route:
        if opts.fail_open:
            raise ValueError(
                "a route patch sends every request to the model-server cluster, so it cannot fail "
                "open: route on the destination header yourself, or drop --fail-open"
            )
        patches.append(
            {
                "applyTo": "HTTP_ROUTE",
                "match": {
                    "context": istio.context,
                    "routeConfiguration": {"vhost": {"route": {"name": istio.route}}},
                },
                "patch": {"operation": "MERGE", "value": {"route": _route_value(opts)}},
            }
        )
    metadata: dict[str, Any] = {"name": istio.name}
    if istio.namespace:
        metadata["namespace"] = istio.namespace
    spec: dict[str, Any] = {}
    if istio.selector:
        spec["workloadSelector"] = {"labels": dict(istio.selector)}
    spec["configPatches"] = patches
    return {
        "apiVersion": "networking.istio.io/v1alpha3",
        "kind": "EnvoyFilter",
        "metadata": metadata,
        "spec": spec,
    }
