"""Runtime options of one EPP, filled from the command line (``epp.cli``) or by tests.

``Settings`` is the one place a command-line flag is declared: a field made with :func:`flag`
carries the flag's name, help text and value kind, and ``epp.cli`` builds its parser from the
fields. Fields made without :func:`flag` are not flags. :meth:`Settings.validate` holds the rules
that tie several fields together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from epp.eventloop import EVENT_LOOPS
from epp.plugin.selectors import parse_selector
from epp.server.tlsopts import tls_problem
from epp.settings.kinds import (
    _FLAG_KEY,
    BOOL,
    DURATION,
    FRACTION,
    INT,
    NAMES,
    OPTIONAL_TEXT,
    PATHS,
    PORTS,
    QUANTITY,
    TEXT,
    Flag,
    Kind,
    SettingsError,
    flag,
)

__all__ = [
    "BOOL",
    "COMPAT_ONLY",
    "DURATION",
    "INT",
    "METRICS_TOKEN_ENV",
    "NAMES",
    "OPTIONAL_TEXT",
    "PATHS",
    "PORTS",
    "QUANTITY",
    "TEXT",
    "Flag",
    "Kind",
    "Settings",
    "SettingsError",
    "flag",
    "flag_of",
    "flags",
]

MIN_REFRESH_METRICS_INTERVAL: Final = 0.05
"""``--refresh-metrics-interval`` below this is raised to it."""

MAX_WORKERS: Final = 64
"""The most ``--workers`` accepted."""


METRICS_TOKEN_ENV: Final = "EPP_METRICS_TOKEN"
"""Outside Kubernetes mode, the bearer token ``/metrics`` and ``/debug/*`` require."""


def flag_of(f: dataclasses.Field[Any]) -> Flag | None:
    """The flag a ``Settings`` field declares, or ``None`` for a field that is not a flag."""
    spec: Flag | None = f.metadata.get(_FLAG_KEY)
    if spec is None:
        return None
    name = spec.name or f.name.replace("_", "-")
    return dataclasses.replace(spec, name=name, compat=spec.compat or COMPAT_ONLY.get(name, ""))


def flags() -> list[tuple[dataclasses.Field[Any], Flag]]:
    """Every ``Settings`` field that is a flag, with its flag, in declaration order."""
    pairs = ((f, flag_of(f)) for f in dataclasses.fields(Settings))
    return [(f, spec) for f, spec in pairs if spec is not None]


# Help texts and defaults are upstream's (spec §2); ``epp --help`` groups them (cli.FLAG_GROUPS).
@dataclass(frozen=True)
class Settings:
    grpc_port: int = flag(9002, "ext_proc gRPC port", INT)
    """ext_proc port (0 = any free port; tests use that)."""
    grpc_health_port: int = flag(9003, "gRPC health port", INT)
    metrics_port: int = flag(9090, "Prometheus /metrics port", INT)
    bind_address: str = flag("0.0.0.0", "address the servers listen on")
    """Our addition: where the servers listen (upstream listens on every address)."""
    pool_name: str = flag("", "InferencePool name (Kubernetes mode)")
    pool_namespace: str = flag("", "InferencePool namespace (env NAMESPACE, then 'default')")
    """The CLI fills an empty value from ``$NAMESPACE``, then ``default``."""
    pool_group: str = flag("inference.networking.k8s.io", "InferencePool API group")
    endpoint_selector: str = flag("", "standalone mode: label selector of the model-server pods")
    endpoint_target_ports: tuple[int, ...] = flag(
        (), "standalone mode: comma-separated target ports (1-8)", PORTS
    )
    kubeconfig: str = flag("", "kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)")
    """controller-runtime's flag; empty = $KUBECONFIG, in-cluster, ~/.kube."""
    objectives_files: tuple[str, ...] = flag(
        (),
        "YAML file(s) of InferenceObjective / InferenceModelRewrite objects, reloaded when "
        "changed (repeatable or comma-separated; any mode)",
        PATHS,
        name="objectives-file",
    )
    """Our addition: YAML files of InferenceObjective and InferenceModelRewrite objects."""
    objectives_poll_interval: float = flag(
        1.0, "how often --objectives-file files are checked for changes (default 1s)", DURATION
    )
    """Our addition: how often the objectives files are checked for changes."""
    ha_lease_duration: float = flag(15.0, "leader election: lease duration (default 15s)", DURATION)
    """Our addition; upstream's fixed controller-runtime default."""
    ha_renew_deadline: float = flag(
        10.0,
        "leader election: the leader steps down when it could not renew for this long "
        "(default 10s)",
        DURATION,
    )
    ha_retry_period: float = flag(
        2.0, "leader election: interval between acquire/renew attempts (default 2s)", DURATION
    )
    config_file: str = flag("", "EndpointPickerConfig YAML file")
    """The CLI reads this file into ``config_text`` and then clears this field."""
    config_text: str | None = flag(None, "EndpointPickerConfig YAML text", OPTIONAL_TEXT)
    """EndpointPickerConfig YAML; ``None`` = the built-in default config."""
    disable_endpoint_subset_filter: bool = flag(False, "ignore the data plane's subset hint", BOOL)
    emit_endpoint_scores: bool = flag(
        False, "add per-endpoint scores to the envoy.lb metadata", BOOL
    )
    allow_experimental_plugins: bool = flag(False, "allow alpha plugins", BOOL)
    ha_enable_leader_election: bool = flag(False, "leader election between replicas", BOOL)
    secure_serving: bool = flag(
        True, "serve ext_proc over TLS (self-signed without --cert-path)", BOOL
    )
    cert_path: str = flag("", "directory with tls.crt and tls.key")
    admin_token_file: str = flag(
        "", "file holding the bearer token the admin gRPC API requires (empty: none)"
    )
    enable_cert_reload: bool = flag(
        False,
        "reload the --cert-path and --metrics-cert-dir certificates when their files change",
        BOOL,
    )
    grpc_client_ca_file: str = flag(
        "", "PEM CA for ext_proc mTLS: require client certificates signed by it"
    )
    """Our addition (upstream has no ext_proc mTLS)."""
    tls_min_version: str = flag(
        "", "minimum TLS version for secure serving (VersionTLS12, VersionTLS13)"
    )
    tls_cipher_suites: tuple[str, ...] = flag(
        (),
        "TLS 1.2 cipher suites for secure serving (Go crypto/tls names, comma-separated)",
        NAMES,
    )
    health_checking: bool = flag(False, "also serve grpc.health.v1 on the ext_proc port", BOOL)
    tracing: bool = flag(
        True,
        "OpenTelemetry tracing of requests, exported as the OTEL_* variables say "
        "(OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_SAMPLER, ...)",
        BOOL,
    )
    tracing_plugin_threshold: float = flag(
        0.001, "with tracing: plugin calls at least this long get a span (default 1ms)", DURATION
    )
    """Our addition (``epp.observability.tracing``)."""
    enable_pprof: bool = flag(
        True, "serve a CPU profile at /debug/pprof/profile (behind the metrics auth)", BOOL
    )
    metrics_endpoint_auth: bool = flag(
        True,
        "authenticate and authorize /metrics and /debug/* (TokenReview and SubjectAccessReview "
        f"in Kubernetes mode, else the bearer token in ${METRICS_TOKEN_ENV})",
        BOOL,
    )
    metrics_cert_dir: str = flag(
        "", "directory with tls.crt and tls.key; serves the metrics port over TLS"
    )
    metrics_client_ca_file: str = flag(
        "", "PEM CA for metrics mTLS: require verified client certificates"
    )
    enable_debug_endpoints: bool = flag(True, "serve /debug/* on the metrics port", BOOL)
    """Our addition: false removes every ``/debug`` view (pprof included)."""
    enable_grpc_stream_metrics: bool = flag(
        False, "record llm_d_epp_extproc_stream* metrics of the ext_proc streams", BOOL
    )
    drain_timeout: float = flag(30.0, "drain window after SIGTERM (default 30s)", DURATION)
    workers: int = flag(
        1,
        "worker processes sharing the ext_proc port (default 1; more than 1 needs a "
        "cross-replica syncer: dataLayer.crossReplicaSyncerPluginRef)",
        INT,
    )
    """Our addition: with more than 1, a supervisor runs this many EPP processes on one host
    (``epp.workers``); 1 is the single process, unchanged."""
    flow_control_pool_wide_max_requests: bool = flag(
        False,
        "with a cross-replica syncer: flowControl maxRequests bound the requests queued across "
        "all replicas, not per replica",
        BOOL,
    )
    flow_control_pool_wide_priority: bool = flag(
        False,
        "with a cross-replica syncer: a band waits while any replica queues a higher band",
        BOOL,
    )
    """Our additions (``epp.flowcontrol.shared``): off, each replica's flow control runs as if
    alone and only reports the pool-wide occupancy."""
    refresh_metrics_interval: float = flag(
        0.05, "scrape interval per endpoint (default 50ms, minimum 50ms)", DURATION
    )
    """Seconds between scrapes of one endpoint; the CLI raises values below 50 ms to 50 ms."""
    refresh_prometheus_metrics_interval: float = flag(
        5.0, "pool gauge refresh (default 5s)", DURATION
    )
    metrics_staleness_threshold: float = flag(
        2.0, "age after which an endpoint's metrics count as stale (default 2s)", DURATION
    )
    grpc_max_recv_msg_size: int = flag(
        4 << 20, "largest gRPC message accepted (default 4MiB, gRPC's)", QUANTITY
    )
    grpc_max_send_msg_size: int = flag(
        2**31 - 1, "largest gRPC message sent (default unlimited, gRPC's)", QUANTITY
    )
    max_request_body_bytes: int = flag(
        64 << 20, "request bodies above this get a 413 (default 64MiB)", QUANTITY
    )
    """Our addition: larger bodies are answered with a 413."""
    response_body_sample_ratio: float = flag(
        1.0,
        "share of the streamed responses no plugin needs that the EPP still reads, for TTFT, "
        "inter-token latency, token and size metrics; the others it does not take (default 1: "
        "every one, as llm-d's EPP; 0.1 trades those metrics' counts for CPU)",
        FRACTION,
    )
    """Our addition (``epp.requestcontrol.bodyneed``)."""
    memory_trim_interval: float = flag(
        60.0,
        "hand the C heap's free pages back to the system this often (glibc malloc_trim; "
        "default 60s, 0 off)",
        DURATION,
    )
    """Our addition (``epp.observability.memory.HeapTrimmer``)."""
    event_loop: str = flag(
        "uvloop",
        "the event loop: uvloop (default; libuv's, in C) or asyncio (the standard library's)",
    )
    """Our addition (``epp.eventloop``)."""
    seed: int | None = flag(None, "seed the scheduler's random source", INT)
    """Our addition: seeds the scheduler's random source (reproducible tie-breaks in tests)."""
    verbosity: int = flag(
        2,
        "log verbosity (2 default, 3 verbose, 4 debug, 5 trace), unless --zap-log-level is set",
        INT,
        name="v",
        short="v",
    )
    zap_encoder: str = flag("", "log encoding, json or console (default: console with --zap-devel)")
    zap_log_level: str = flag(
        "",
        "log level: debug, info, warn, error, dpanic, panic, fatal, or an integer > 0 "
        "(verbosity); default from -v",
    )
    zap_stacktrace_level: str = flag(
        "", "level from which lines carry a stack trace (default error)"
    )
    zap_time_encoding: str = flag(
        "", "ts format: rfc3339 (default), rfc3339nano, iso8601, epoch, millis, nano"
    )
    zap_devel: bool = flag(
        True,
        "development defaults (console encoder); false: production defaults (json encoder)",
        BOOL,
    )
    """Logging (``epp.observability.logs``) with controller-runtime's semantics."""

    # Not flags.
    metrics_token: str = dataclasses.field(default="", repr=False)
    """``$EPP_METRICS_TOKEN``: the static bearer token of the metrics port outside Kubernetes."""
    log_json: bool = False
    """JSON log lines: ``--zap-encoder=json``, or ``--zap-devel=false`` without an encoder."""
    pod_name: str = ""
    """``$POD_NAME``: in standalone mode the pool is named after this pod's Deployment."""
    kube_watch_timeout: int = 300
    """Our addition: server-side timeout of each Kubernetes watch call, in seconds."""
    group_member: bool = False
    """Set by ``epp --workers N`` on its workers: the ext_proc port is shared with the other
    workers (SO_REUSEPORT), and the health and metrics servers listen on loopback only (the
    supervisor answers for the group on the public ports). A single process never shares its
    port, so a second ``epp`` started by mistake on the same port fails instead of splitting
    the traffic."""

    @classmethod
    def from_command_line(cls, values: Mapping[str, Any], environ: Mapping[str, str]) -> Settings:
        """The settings a command line describes: the flag ``values`` (by field name) plus what
        upstream takes from the environment or derives from other flags. Not validated."""
        s = cls(**values)
        return dataclasses.replace(
            s,
            pool_namespace=s.pool_namespace or environ.get("NAMESPACE", "default"),
            pod_name=environ.get("POD_NAME", ""),
            metrics_token=environ.get(METRICS_TOKEN_ENV, ""),
            refresh_metrics_interval=max(s.refresh_metrics_interval, MIN_REFRESH_METRICS_INTERVAL),
            log_json=(s.zap_encoder or ("console" if s.zap_devel else "json")) == "json",
        )

    def validate(self) -> None:
        """Raise :class:`SettingsError` unless the fields fit together (spec §2): one config
        source; at most one Kubernetes mode, standalone mode with a well-formed selector and its
        target ports; ``--workers`` 1..64 and never with leader election; a known
        ``--event-loop``; a trim interval of 0 or more; leader election in Kubernetes mode with
        0 < retry < renew < lease."""
        if self.config_file and self.config_text:
            raise SettingsError("--config-file and --config-text are mutually exclusive")
        problem = tls_problem(self)
        if problem:
            raise SettingsError(problem)
        if self.pool_name and self.endpoint_selector:
            raise SettingsError("--pool-name and --endpoint-selector are mutually exclusive")
        if self.endpoint_selector:
            try:
                parse_selector(self.endpoint_selector)
            except ValueError as exc:
                raise SettingsError(f"--endpoint-selector: {exc}") from None
            if not self.endpoint_target_ports:
                raise SettingsError("--endpoint-selector needs --endpoint-target-ports")
        elif self.endpoint_target_ports:
            raise SettingsError("--endpoint-target-ports is only used with --endpoint-selector")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise SettingsError(f"--workers must be 1..{MAX_WORKERS}")
        if self.event_loop not in EVENT_LOOPS:
            raise SettingsError(f"--event-loop must be one of {', '.join(EVENT_LOOPS)}")
        if self.memory_trim_interval < 0:
            raise SettingsError("--memory-trim-interval must be 0 (off) or more")
        if self.workers > 1 and self.ha_enable_leader_election:
            raise SettingsError(
                "--workers above 1 and --ha-enable-leader-election are mutually exclusive: the "
                "workers of one host are one replica, and each would compete for the lease"
            )
        if not self.ha_enable_leader_election:
            return
        if not (self.pool_name or self.endpoint_selector):
            raise SettingsError(
                "--ha-enable-leader-election needs Kubernetes mode "
                "(--pool-name or --endpoint-selector)"
            )
        if not 0 < self.ha_retry_period < self.ha_renew_deadline < self.ha_lease_duration:
            raise SettingsError(
                "leader election needs 0 < --ha-retry-period < --ha-renew-deadline < "
                "--ha-lease-duration"
            )


COMPAT_ONLY: Final[Mapping[str, str]] = {}
"""Flags accepted for compatibility only: each does nothing and says so at startup when given.
A flag some code reads must not be listed (``tests/unit/test_cli.py`` checks it)."""
