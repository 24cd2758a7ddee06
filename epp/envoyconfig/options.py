"""What ``epp envoy-config`` generates: the options of one Envoy in front of the EPP.

Every field has the default an operator most likely wants; ``epp envoy-config --help`` maps each
flag to one field. The options are validated here, once, so the builders can stay plain.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

HostPort = tuple[str, int]
TlsMode = Literal["plaintext", "tls", "mtls"]
BodyMode = Literal["full-duplex", "buffered", "streamed"]
AppProtocol = Literal["http", "h2c"]

DESTINATION_HEADER = "x-gateway-destination-endpoint"
"""The header the EPP sets and the ORIGINAL_DST model-server cluster routes on."""


def parse_hostport(text: str) -> HostPort:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → ``(host, port)``; ValueError on anything else."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class EnvoyOptions:
    """One Envoy: a listener whose ext_proc filter asks the EPP(s), the model-server cluster, and
    (buffered fail-open) a fallback cluster."""

    epp: Sequence[HostPort]
    """The EPP's ext_proc address; several: active-active replicas, health-checked."""
    tls: TlsMode = "tls"
    """How Envoy reaches the EPP: plaintext, TLS (the EPP's default ``--secure-serving``), mTLS."""
    ca_file: str = ""
    """TLS/mTLS: CA bundle that verifies the EPP's certificate (empty: not verified, as for the
    EPP's self-signed default certificate)."""
    cert_file: str = ""
    """mTLS: Envoy's client certificate chain."""
    key_file: str = ""
    """mTLS: Envoy's client private key."""
    sni: str = ""
    """TLS/mTLS: server name sent to the EPP (and checked against its certificate with ca_file)."""
    body: BodyMode = "full-duplex"
    """full-duplex: FULL_DUPLEX_STREAMED request and response bodies (as GIE gateways use);
    buffered: the request body BUFFERED, response headers and body not sent to the EPP;
    streamed: the request body BUFFERED, the response headers sent and the response body STREAMED,
    which the EPP may switch off per response (``mode_override``, allowed only to NONE)."""
    fail_open: bool = False
    """When the EPP is down or slow, let requests through (to ``fallback``). Envoy 1.40 fails
    open only when the request body is buffered; full-duplex with fail-open is refused."""
    fallback: Sequence[HostPort] = ()
    """Fail-open: where requests go round robin without an EPP decision (hostnames are resolved
    by DNS, every address of the name an endpoint)."""
    listen: HostPort = ("0.0.0.0", 8081)
    admin: HostPort = ("127.0.0.1", 19000)
    route_timeout: float = 300.0
    """Seconds a request may take end to end (what bounds a hung EPP in full-duplex mode)."""
    message_timeout: float = 0.0
    """Seconds Envoy waits for each EPP answer; 0: 1000 s in full-duplex (where Envoy does not
    enforce it), 0.5 s otherwise."""
    grpc_timeout: float = 10.0
    """Seconds to open the ext_proc stream."""
    health_checks: bool | None = None
    """gRPC health checks of the EPP cluster (the EPP's ``--health-checking``); None: on when
    there are several EPP replicas."""
    health_interval: float = 5.0
    max_streams_per_connection: int = 0
    """Envoy opens a further connection to the EPP past this many concurrent streams (``epp
    --workers``: the kernel spreads connections, not streams, over the workers); 0: the limit
    the EPP advertises, 1,000 (Envoy does not hold to an advertised limit by itself)."""
    max_requests_per_connection: int = 0
    """> 0: a connection to the EPP carries at most this many ext_proc streams."""
    max_concurrent_requests: int = 100_000
    """Envoy's circuit breakers on every cluster (connections, pending and active requests): how
    many requests the gateway holds in flight. Envoy's own default is 1,024 per cluster, and every
    request in flight holds an ext_proc stream to the EPP for its whole length (and, over
    HTTP/1.1, a connection to its model server), so left at that default a gateway answers 503
    past 1,024 requests in flight, however idle the EPP and the pods are."""
    pool: Sequence[HostPort] = ()
    """The model servers' addresses, when Envoy should know them (fixed addresses, or a headless
    Service name resolved by DNS): the model-server cluster then routes with the override-host
    policy and ejects failing pods, and a retry goes to another pod (``epp.envoyconfig.retries``).
    Empty: ORIGINAL_DST on the destination header, as upstream."""
    pool_health_path: str = ""
    """With ``pool``: an HTTP path Envoy checks each model server on every second (``/health`` on
    vLLM and SGLang), so that retries and the fallback pick skip addresses with no ready server
    behind them (a static list that names pods not started yet, or gone). Empty: none."""
    app_protocol: AppProtocol = "http"
    """How Envoy speaks to the model servers, as the InferencePool's ``appProtocol``: ``http``
    (HTTP/1.1, Envoy's default for a cluster) or ``h2c`` (``kubernetes.io/h2c``: HTTP/2 without
    TLS, which gRPC model servers such as vLLM's gRPC engine and Vertex AI's PredictionService
    need). Applies to the model-server and fallback clusters."""
    retries: int = 2
    """Retries of a request that failed before its answer started (``epp.envoyconfig.retries``);
    0: none."""
    report_served: bool = True
    """Full-duplex: a Lua filter reports the endpoint that served the request back to the EPP as
    ``envoy.lb`` response metadata (``x-gateway-destination-endpoint-served``)."""
    subset_hint_header: bool = False
    """Tests: a client header ``x-test-subset-hint: ip:port,...`` becomes the
    ``envoy.lb.subset_hint`` metadata a data plane would set. Not for production."""

    def __post_init__(self) -> None:
        if not self.epp:
            raise ValueError("at least one EPP address is needed")
        if self.tls == "mtls" and not (self.cert_file and self.key_file):
            raise ValueError("mTLS needs a client certificate and key (--cert-file, --key-file)")
        if self.tls == "plaintext" and (self.ca_file or self.cert_file or self.key_file):
            raise ValueError("certificate files need --tls tls or mtls")
        if self.tls != "mtls" and (self.cert_file or self.key_file):
            raise ValueError("a client certificate needs --tls mtls")
        if self.fail_open and self.body == "full-duplex":
            raise ValueError(
                "Envoy does not fail open in FULL_DUPLEX_STREAMED mode (a dead EPP gives 500): "
                "use --body buffered or streamed with --fail-open"
            )
        if self.fallback and not self.fail_open:
            raise ValueError("fallback endpoints are only used with --fail-open")
        if self.fail_open and not self.fallback:
            raise ValueError("--fail-open needs --fallback HOST:PORT (where requests go then)")
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if self.max_concurrent_requests < 1:
            raise ValueError("max concurrent requests must be >= 1")
        for name in ("route_timeout", "message_timeout", "grpc_timeout", "health_interval"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")

    @property
    def effective_message_timeout(self) -> float:
        if self.message_timeout > 0:
            return self.message_timeout
        return 1000.0 if self.body == "full-duplex" else 0.5

    @property
    def request_buffered(self) -> bool:
        """Envoy holds the whole request body and sends it in one message (buffered, streamed)."""
        return self.body != "full-duplex"

    @property
    def sends_response(self) -> bool:
        """The EPP sees the response phase (full-duplex, streamed)."""
        return self.body != "buffered"

    @property
    def effective_health_checks(self) -> bool:
        return len(self.epp) > 1 if self.health_checks is None else self.health_checks
