"""The clusters: the EPP (HTTP/2, plaintext/TLS/mTLS, health-checked replicas), the model
servers (ORIGINAL_DST on the destination header the EPP sets, or the known pool with the
override-host policy and outlier detection; HTTP/1.1, or HTTP/2 without TLS for ``h2c``) and the
fail-open fallback."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any as AnyValue

from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterCommonLbConfig,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    DataSource,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    HealthCheckHttpHealthCheck,
    Http2ProtocolOptions,
    SocketAddress,
    TransportSocket,
)
from envoy_data_plane.envoy.config.core.v3 import HttpProtocolOptions as CommonHttpOptions
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    TlsCertificate,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.v3 import Percent
from envoy_data_plane.google.protobuf import Any

from epp.envoyconfig.filters import EPP_CLUSTER, seconds
from epp.envoyconfig.options import DESTINATION_HEADER, EnvoyOptions, HostPort, is_ip
from epp.envoyconfig.retries import outlier_detection, override_host_policy, retry_budget

POOL_CLUSTER = "pool"
FALLBACK_CLUSTER = "fallback"
_HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


DEFAULT_MAX_CONCURRENT_REQUESTS = 100_000
EPP_MAX_CONCURRENT_STREAMS = 1000
"""The streams per connection the EPP's server advertises and enforces
(``epp.server.h2limits.MAX_CONCURRENT_STREAMS``; the generator stands apart from the server)."""


def circuit_breakers(limit: int, *, retried: bool = False) -> CircuitBreakers:
    """Connections, pending and active requests up to ``limit`` (Envoy's default is 1,024 each,
    which caps a gateway at 1,024 requests in flight: each holds an ext_proc stream and, over
    HTTP/1.1, a model-server connection). ``retried``: a model-server cluster the routes retry
    on, which gets ``retries.retry_budget`` in place of Envoy's 3 retries at once."""
    threshold = CircuitBreakersThresholds(
        max_connections=limit, max_pending_requests=limit, max_requests=limit
    )
    if retried:
        threshold.retry_budget = retry_budget()
    return CircuitBreakers(thresholds=[threshold])


def _limit(opts: EnvoyOptions | None) -> int:
    return opts.max_concurrent_requests if opts is not None else DEFAULT_MAX_CONCURRENT_REQUESTS


def socket(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def load_assignment(name: str, endpoints: Sequence[HostPort]) -> ClusterLoadAssignment:
    lb = [LbEndpoint(endpoint=Endpoint(address=socket(h, p))) for h, p in endpoints]
    return ClusterLoadAssignment(
        cluster_name=name, endpoints=[LocalityLbEndpoints(lb_endpoints=lb)]
    )


def _tls(opts: EnvoyOptions) -> TransportSocket:
    common = CommonTlsContext(alpn_protocols=["h2"])
    if opts.ca_file:
        common.validation_context = CertificateValidationContext(
            trusted_ca=DataSource(filename=opts.ca_file)
        )
    if opts.tls == "mtls":
        common.tls_certificates = [
            TlsCertificate(
                certificate_chain=DataSource(filename=opts.cert_file),
                private_key=DataSource(filename=opts.key_file),
            )
        ]
    context = UpstreamTlsContext(common_tls_context=common, sni=opts.sni)
    return TransportSocket(name="envoy.transport_sockets.tls", typed_config=Any.pack(context))


HEALTH_TIMEOUT_S = 2.0
"""Seconds Envoy waits for a replica's health answer (upstream's Envoy configs use 2 s)."""
UNHEALTHY_THRESHOLD = 3
"""Health checks in a row that must time out (or fail to connect) before Envoy takes a replica
out, as upstream's configs. An answer of NOT_SERVING (starting, replaying shared state,
draining) is an active failure, which Envoy acts on at once whatever this threshold."""


def _health_check(opts: EnvoyOptions) -> HealthCheck:
    """A replica that answers NOT_SERVING gets no further stream at once; one that is merely
    slow to answer (a busy CPU, a long pause of its runtime) stays in rotation until three
    checks in a row have timed out. With one timeout enough, every replica of a briefly starved
    group was marked unhealthy together and, with no panic routing, Envoy answered 500."""
    return HealthCheck(
        timeout=seconds(HEALTH_TIMEOUT_S),
        interval=seconds(opts.health_interval),
        no_traffic_interval=seconds(opts.health_interval),
        unhealthy_threshold=UNHEALTHY_THRESHOLD,
        healthy_threshold=1,
        grpc_health_check=HealthCheckGrpcHealthCheck(),
    )


def _pool_health_check(path: str) -> HealthCheck:
    """A model server is out of the fallback pick and of retries after one failed check, back
    after one good one; the EPP's own first pick is not affected (override hosts are not
    health-checked by Envoy), which the EPP's scrape of every pod covers."""
    return HealthCheck(
        timeout=seconds(1.0),
        interval=seconds(1.0),
        no_traffic_interval=seconds(1.0),
        unhealthy_threshold=1,
        healthy_threshold=1,
        http_health_check=HealthCheckHttpHealthCheck(path=path),
    )


def model_server_options(opts: EnvoyOptions | None) -> dict[str, AnyValue]:
    """The typed protocol options of a model-server cluster: HTTP/2 for ``h2c`` (else none:
    Envoy's default HTTP/1.1)."""
    if opts is None or opts.app_protocol != "h2c":
        return {}
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()
        )
    )
    return {_HTTP_OPTIONS: Any.pack(options)}


def _addresses_type(endpoints: Sequence[HostPort]) -> ClusterDiscoveryType:
    if all(is_ip(h) for h, _ in endpoints):
        return ClusterDiscoveryType.STATIC
    return ClusterDiscoveryType.STRICT_DNS


def epp_cluster(opts: EnvoyOptions) -> Cluster:
    """The EPP: HTTP/2 (gRPC), over TLS unless plaintext; with health checks no panic routing:
    with most replicas out (dead, draining) Envoy sends every stream to the ones left rather than
    spread them over dead ones, and with every replica out a request fails at once (or fails open
    to the fallback)."""
    # Envoy does not hold to the stream limit the EPP advertises: past it, its streams on one
    # connection were refused (24 failed requests of 1,100 in flight), so it is set here too,
    # and Envoy opens a further connection instead.
    h2 = Http2ProtocolOptions(
        max_concurrent_streams=opts.max_streams_per_connection or EPP_MAX_CONCURRENT_STREAMS
    )
    options = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(http2_protocol_options=h2)
    )
    if opts.max_requests_per_connection > 0:
        options.common_http_protocol_options = CommonHttpOptions(
            max_requests_per_connection=opts.max_requests_per_connection
        )
    cluster = Cluster(
        name=EPP_CLUSTER,
        type=_addresses_type(opts.epp),
        connect_timeout=seconds(2.0),
        circuit_breakers=circuit_breakers(_limit(opts)),
        typed_extension_protocol_options={_HTTP_OPTIONS: Any.pack(options)},
        load_assignment=load_assignment(EPP_CLUSTER, opts.epp),
    )
    if opts.tls != "plaintext":
        cluster.transport_socket = _tls(opts)
    if opts.effective_health_checks:
        cluster.health_checks = [_health_check(opts)]
        cluster.common_lb_config = ClusterCommonLbConfig(healthy_panic_threshold=Percent(value=0))
    return cluster


def pool_cluster(opts: EnvoyOptions | None = None) -> Cluster:
    """The model servers: with ``opts.pool``, those addresses, routed by the override-host
    policy with outlier detection (``epp.envoyconfig.retries``); else ORIGINAL_DST: Envoy
    connects to the address in the header the EPP set."""
    if opts is not None and opts.pool:
        cluster = Cluster(
            name=POOL_CLUSTER,
            type=_addresses_type(opts.pool),
            connect_timeout=seconds(2.0),
            circuit_breakers=circuit_breakers(_limit(opts), retried=True),
            typed_extension_protocol_options=model_server_options(opts),
            load_assignment=load_assignment(POOL_CLUSTER, opts.pool),
            load_balancing_policy=override_host_policy(),
            outlier_detection=outlier_detection(),
        )
        if opts.pool_health_path:
            # No panic routing: with half the listed addresses failing their checks (pods
            # gone, their replacements not up yet, one terminating), Envoy's default would
            # spread retries over every address, dead ones included.
            cluster.health_checks = [_pool_health_check(opts.pool_health_path)]
            cluster.common_lb_config = ClusterCommonLbConfig(
                healthy_panic_threshold=Percent(value=0)
            )
        return cluster
    return Cluster(
        name=POOL_CLUSTER,
        type=ClusterDiscoveryType.ORIGINAL_DST,
        lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
        connect_timeout=seconds(2.0),
        circuit_breakers=circuit_breakers(_limit(opts), retried=True),
        typed_extension_protocol_options=model_server_options(opts),
        original_dst_lb_config=ClusterOriginalDstLbConfig(
            use_http_header=True, http_header_name=DESTINATION_HEADER
        ),
    )


def static_cluster(
    name: str,
    endpoints: Sequence[HostPort],
    lb_policy: str = "ROUND_ROBIN",
    opts: EnvoyOptions | None = None,
) -> Cluster:
    """A plain cluster over fixed endpoints (the fail-open fallback; Envoy alone, as a baseline);
    ``opts``: model servers spoken to by its ``app_protocol``."""
    return Cluster(
        name=name,
        type=_addresses_type(endpoints),
        lb_policy=ClusterLbPolicy[lb_policy],
        connect_timeout=seconds(2.0),
        circuit_breakers=circuit_breakers(_limit(opts), retried=True),
        typed_extension_protocol_options=model_server_options(opts),
        load_assignment=load_assignment(name, endpoints),
    )


def clusters(opts: EnvoyOptions) -> list[Cluster]:
    out = [pool_cluster(opts), epp_cluster(opts)]
    if opts.fail_open:
        out.insert(0, static_cluster(FALLBACK_CLUSTER, opts.fallback, opts=opts))
    return out
