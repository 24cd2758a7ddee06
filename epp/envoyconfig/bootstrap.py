"""The listener (HTTP connection manager, routes, filters) and the whole bootstrap."""

from __future__ import annotations

from collections.abc import Sequence

from envoy_data_plane.envoy.config.bootstrap.v3 import (
    Admin,
    Bootstrap,
    BootstrapStaticResources,
    LayeredRuntime,
    RuntimeLayer,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutation as Mutation
from envoy_data_plane.envoy.config.core.v3 import TypedExtensionConfig
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    HeaderMatcher,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    HeaderMutation,
)
from envoy_data_plane.google.protobuf import Any, Struct, Value

from epp.envoyconfig.clusters import (
    FALLBACK_CLUSTER,
    POOL_CLUSTER,
    clusters,
    socket,
    static_cluster,
)
from epp.envoyconfig.filters import http_filters, router_filter, seconds
from epp.envoyconfig.options import DESTINATION_HEADER, EnvoyOptions, HostPort
from epp.envoyconfig.retries import retry_policy

BUFFER_LIMIT = 16 * 1024 * 1024
"""Buffered and streamed modes: the largest request body Envoy holds for the EPP (per
connection)."""


def pool_route_action(opts: EnvoyOptions) -> RouteAction:
    """To the model-server cluster, with the retry policy (``epp.envoyconfig.retries``)."""
    action = RouteAction(cluster=POOL_CLUSTER, timeout=seconds(opts.route_timeout))
    action.retry_policy = retry_policy(opts, other_hosts=bool(opts.pool))
    return action


def _routes(opts: EnvoyOptions) -> list[Route]:
    if not opts.fail_open:
        return [Route(match=RouteMatch(prefix="/"), route=pool_route_action(opts))]
    # Fail-open: a request the EPP decided carries the destination header; any other goes to
    # the fallback cluster.
    decided = RouteMatch(
        prefix="/", headers=[HeaderMatcher(name=DESTINATION_HEADER, present_match=True)]
    )
    fallback = RouteAction(cluster=FALLBACK_CLUSTER, timeout=seconds(opts.route_timeout))
    fallback.retry_policy = retry_policy(opts, other_hosts=True)
    return [
        Route(match=decided, route=pool_route_action(opts)),
        Route(match=RouteMatch(prefix="/"), route=fallback),
    ]


def _strip_client_destination() -> TypedExtensionConfig:
    """Removes a client-sent destination header before routing: a client cannot pick the pod
    (even when the EPP is bypassed by fail-open)."""
    mutation = HeaderMutation(mutations=[Mutation(remove=DESTINATION_HEADER)])
    return TypedExtensionConfig(
        name="envoy.http.early_header_mutation.header_mutation", typed_config=Any.pack(mutation)
    )


def connection_manager(
    opts: EnvoyOptions | None, filters: Sequence[HttpFilter], routes: list[Route]
) -> HttpConnectionManager:
    hcm = HttpConnectionManager(
        stat_prefix="ingress",
        route_config=RouteConfiguration(
            virtual_hosts=[VirtualHost(name="all", domains=["*"], routes=routes)]
        ),
        http_filters=list(filters),
    )
    if opts is not None:
        hcm.early_header_mutation_extensions = [_strip_client_destination()]
        hcm.stream_idle_timeout = seconds(opts.route_timeout)
    return hcm


def listener(opts: EnvoyOptions) -> Listener:
    hcm = connection_manager(opts, http_filters(opts), _routes(opts))
    return _listener(opts.listen, hcm, BUFFER_LIMIT if opts.request_buffered else 0)


def _listener(listen: HostPort, hcm: HttpConnectionManager, buffer_limit: int) -> Listener:
    out = Listener(
        name="main",
        address=socket(*listen),
        filter_chains=[
            FilterChain(
                filters=[
                    Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=Any.pack(hcm),
                    )
                ]
            )
        ],
    )
    if buffer_limit:
        out.per_connection_buffer_limit_bytes = buffer_limit
    return out


GRACEFUL_EXT_PROC_CLOSE = "envoy.reloadable_features.ext_proc_graceful_grpc_close"
"""Envoy (1.34+, off by default) ends an ext_proc stream by half-closing it and waiting up to 1 s
for the EPP's status, instead of half-closing and resetting it at once. The reset cancels the
EPP's pending read or fails its final status, and grpcio's asyncio server leaks that batch's
native ``grpc_op`` array every time (grpc/grpc#43360): about 100 bytes of C heap per request,
which ``epp bench soak`` saw as RSS that never stopped growing."""


def runtime() -> LayeredRuntime:
    """The static runtime layer: graceful ext_proc stream close on."""
    flags = {GRACEFUL_EXT_PROC_CLOSE: Value(bool_value=True)}
    return LayeredRuntime(layers=[RuntimeLayer(name="static", static_layer=Struct(fields=flags))])


def bootstrap(opts: EnvoyOptions) -> Bootstrap:
    """A complete Envoy config: admin, the listener, the clusters, the runtime flags."""
    return Bootstrap(
        admin=Admin(address=socket(*opts.admin)),
        static_resources=BootstrapStaticResources(
            listeners=[listener(opts)], clusters=clusters(opts)
        ),
        layered_runtime=runtime(),
    )


def baseline_bootstrap(
    listen: HostPort,
    admin: HostPort,
    endpoints: Sequence[HostPort],
    lb_policy: str = "ROUND_ROBIN",
    route_timeout: float = 300.0,
) -> Bootstrap:
    """Envoy alone, balancing over ``endpoints`` with its own ``lb_policy``: the baseline the
    benchmarks compare the EPP with (``route_timeout`` seconds, as the EPP's Envoy)."""
    action = RouteAction(cluster=POOL_CLUSTER, timeout=seconds(route_timeout))
    route = Route(match=RouteMatch(prefix="/"), route=action)
    hcm = connection_manager(None, [router_filter()], [route])
    return Bootstrap(
        admin=Admin(address=socket(*admin)),
        static_resources=BootstrapStaticResources(
            listeners=[_listener(listen, hcm, 0)],
            clusters=[static_cluster(POOL_CLUSTER, endpoints, lb_policy)],
        ),
    )
