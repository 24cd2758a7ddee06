"""Runtime options of one EPP, filled from the command line (``epp.cli``) or by tests.

``Settings`` is the one place a command-line flag is declared: a field made with :func:`flag`
carries the flag's name, help text and value kind, and ``epp.cli`` builds its parser from the
fields. Fields made without :func:`flag` are not flags. :meth:`Settings.validate` holds the rules
that tie several fields together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from epp.k8s.selector import parse_selector
from epp.plugin.units import parse_duration, parse_quantity

T = TypeVar("T")

MIN_REFRESH_METRICS_INTERVAL: Final = 0.05
"""``--refresh-metrics-interval`` below this is raised to it."""

MAX_WORKERS: Final = 64
"""The most ``--workers`` accepted."""


class SettingsError(ValueError):
    """A flag value, or a combination of settings, that the EPP refuses; the message is shown
    as is (the CLI prints it as an argparse error, exit code 2)."""


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "t"):
        return True
    if value in ("false", "0", "f"):
        return False
    raise SettingsError(f"invalid boolean {text!r} (use true or false)")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _quantity(text: str) -> int:
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _ports(text: str) -> tuple[int, ...]:
    # A non-number raises int()'s ValueError: argparse reports "invalid _ports value: '…'".
    ports = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    if not all(1 <= p <= 65535 for p in ports):
        raise SettingsError("--endpoint-target-ports: ports are 1..65535")
    if not 1 <= len(ports) <= 8:
        raise SettingsError("--endpoint-target-ports takes 1 to 8 ports")
    return ports


def _paths(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _text_or_none(text: str) -> str | None:
    return text or None


@dataclass(frozen=True)
class Kind:
    """How one flag's text becomes a field value. ``parse`` raises :class:`SettingsError` with a
    message to show, or a plain ``ValueError`` (argparse then says "invalid <parse> value")."""

    parse: Callable[[str], Any]
    metavar: str | None = None
    """``None``: the flag name in capitals, as argparse shows it."""
    optional_value: bool = False
    """Go-style boolean: ``--flag`` alone means true, ``--flag=false`` also works."""
    repeat: bool = False
    """The flag may be given several times; the tuples ``parse`` returns are concatenated."""


TEXT: Final = Kind(str)
OPTIONAL_TEXT: Final = Kind(_text_or_none)
"""Text where an empty value means ``None``."""
INT: Final = Kind(int)
BOOL: Final = Kind(_bool, metavar="BOOL", optional_value=True)
DURATION: Final = Kind(_duration)
"""Go durations (``50ms``, ``1m30s``) → seconds."""
QUANTITY: Final = Kind(_quantity)
"""Quantities (``10MiB``, ``25MB``) → an int."""
PORTS: Final = Kind(_ports)
"""Comma-separated ports, 1 to 8, duplicates dropped."""
PATHS: Final = Kind(_paths, metavar="PATH[,PATH]", repeat=True)
"""Paths, repeatable and comma-separated."""


@dataclass(frozen=True)
class Flag:
    """The command-line flag of one ``Settings`` field."""

    name: str
    """Long name without dashes (``grpc-port``)."""
    help: str
    kind: Kind
    short: str = ""
    """One-letter alias without the dash (``v``), or empty."""

    @property
    def option_strings(self) -> list[str]:
        long = f"--{self.name}"
        return [f"-{self.short}", long] if self.short else [long]

    @property
    def metavar(self) -> str:
        return self.kind.metavar or self.name.upper().replace("-", "_")


_FLAG_KEY: Final = "epp.flag"


def flag(default: T, help: str, kind: Kind = TEXT, *, name: str = "", short: str = "") -> T:
    """A ``Settings`` field that is also a command-line flag. ``name`` defaults to the field name
    with ``-`` for ``_`` (filled in by :func:`flag_of`). Boolean flags get "(default x)" added to
    their help."""
    if kind.optional_value:
        help = f"{help} (default {str(default).lower()})"
    spec = Flag(name=name, help=help, kind=kind, short=short)
    result: T = dataclasses.field(default=default, metadata={_FLAG_KEY: spec})
    return result


def flag_of(f: dataclasses.Field[Any]) -> Flag | None:
    """The flag a ``Settings`` field declares, or ``None`` for a field that is not a flag."""
    spec: Flag | None = f.metadata.get(_FLAG_KEY)
    if spec is None or spec.name:
        return spec
    return dataclasses.replace(spec, name=f.name.replace("_", "-"))


def flags() -> list[tuple[dataclasses.Field[Any], Flag]]:
    """Every ``Settings`` field that is a flag, with its flag, in declaration (= help) order."""
    pairs = ((f, flag_of(f)) for f in dataclasses.fields(Settings))
    return [(f, spec) for f, spec in pairs if spec is not None]


# Field order is the order of ``epp --help``. Help texts and defaults are upstream's (spec §2).
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
    enable_cert_reload: bool = flag(False, "reload the certificate when it changes (not yet)", BOOL)
    health_checking: bool = flag(False, "also serve grpc.health.v1 on the ext_proc port", BOOL)
    ext_proc_server: str = flag(
        "grpc",
        "what serves the ext_proc port: grpc (grpc.aio) or h2 (the EPP's own HTTP/2 server: about "
        "5x less CPU per message)",
    )
    """Our addition (``epp.server.h2``). ``grpc`` stays the default until ``h2``'s latency on a
    heavily loaded machine in ``epp bench`` is understood (see README "Per-request cost")."""
    tracing: bool = flag(
        True, "OpenTelemetry tracing (accepted; tracing is not exported yet)", BOOL
    )
    enable_pprof: bool = flag(True, "accepted for compatibility; no effect", BOOL)
    metrics_endpoint_auth: bool = flag(
        True, "accepted for compatibility (no Kubernetes authn here)", BOOL
    )
    enable_grpc_stream_metrics: bool = flag(False, "accepted for compatibility", BOOL)
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
        64 << 20, "largest gRPC message accepted (default 64MiB)", QUANTITY
    )
    grpc_max_send_msg_size: int = flag(
        64 << 20, "largest gRPC message sent (default 64MiB)", QUANTITY
    )
    max_request_body_bytes: int = flag(
        64 << 20, "request bodies above this get a 413 (default 64MiB)", QUANTITY
    )
    """Our addition: larger bodies are answered with a 413."""
    seed: int | None = flag(None, "seed the scheduler's random source", INT)
    """Our addition: seeds the scheduler's random source (reproducible tie-breaks in tests)."""
    verbosity: int = flag(
        2, "log verbosity (2 default, 3 verbose, 4 debug, 5 trace)", INT, name="v", short="v"
    )
    zap_encoder: str = flag("", "controller-runtime logging flag")
    """``json`` turns ``log_json`` on (CLI)."""
    zap_log_level: str = flag("", "controller-runtime logging flag")
    zap_stacktrace_level: str = flag("", "controller-runtime logging flag")
    zap_time_encoding: str = flag("", "controller-runtime logging flag")
    zap_devel: bool = flag(False, "controller-runtime logging flag", BOOL)

    # Not flags.
    log_json: bool = False
    """JSON log lines; the CLI sets it from ``--zap-encoder=json``."""
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
            refresh_metrics_interval=max(s.refresh_metrics_interval, MIN_REFRESH_METRICS_INTERVAL),
            log_json=s.zap_encoder == "json",
        )

    def validate(self) -> None:
        """Raise :class:`SettingsError` unless the fields fit together (spec §2): one config
        source; at most one Kubernetes mode, standalone mode with a well-formed selector and its
        target ports; ``--workers`` 1..64 and never with leader election; leader election in
        Kubernetes mode with 0 < retry < renew < lease."""
        if self.config_file and self.config_text:
            raise SettingsError("--config-file and --config-text are mutually exclusive")
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
        if self.ext_proc_server not in ("h2", "grpc"):
            raise SettingsError("--ext-proc-server must be h2 or grpc")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise SettingsError(f"--workers must be 1..{MAX_WORKERS}")
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
