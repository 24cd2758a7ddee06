"""Command line: upstream's flags, names and defaults (spec §2), plus a few subcommands.

``epp [flags]`` runs the EPP. ``epp plugins list`` lists the installed plugins. ``epp sim`` runs
the model-server simulator. ``epp stack`` runs the local demo stack.

Boolean flags accept ``--flag``, ``--flag=true`` and ``--flag=false``; durations take Go syntax
(``50ms``, ``30s``); sizes take quantities (``10MiB``); single-dash long flags (``-grpc-port``)
are accepted as Go's flag package does.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from epp.plugin.units import parse_duration, parse_quantity
from epp.settings import Settings

_REJECTED = {
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
}


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "t"):
        return True
    if value in ("false", "0", "f"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _quantity(text: str) -> int:
    try:
        return parse_quantity(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ports(text: str) -> tuple[int, ...]:
    ports = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    if not all(1 <= p <= 65535 for p in ports):
        raise argparse.ArgumentTypeError("--endpoint-target-ports: ports are 1..65535")
    if not 1 <= len(ports) <= 8:
        raise argparse.ArgumentTypeError("--endpoint-target-ports takes 1 to 8 ports")
    return ports


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="epp",
        description="Endpoint Picker for LLM inference (Envoy ext_proc). Subcommands: "
        "'epp plugins list', 'epp sim --help', 'epp stack --help', 'epp bench --help'.",
    )

    def flag(name: str, default: bool, help_: str) -> None:
        p.add_argument(
            f"--{name}",
            type=_bool,
            nargs="?",
            const=True,
            default=default,
            metavar="BOOL",
            help=f"{help_} (default {str(default).lower()})",
        )

    p.add_argument("--grpc-port", type=int, default=9002, help="ext_proc gRPC port")
    p.add_argument("--grpc-health-port", type=int, default=9003, help="gRPC health port")
    p.add_argument("--metrics-port", type=int, default=9090, help="Prometheus /metrics port")
    p.add_argument("--bind-address", default="0.0.0.0", help="address the servers listen on")
    p.add_argument("--pool-name", default="", help="InferencePool name (Kubernetes mode)")
    p.add_argument(
        "--pool-namespace",
        default="",
        help="InferencePool namespace (env NAMESPACE, then 'default')",
    )
    p.add_argument(
        "--pool-group", default="inference.networking.k8s.io", help="InferencePool API group"
    )
    p.add_argument(
        "--endpoint-selector",
        default="",
        help="standalone mode: label selector of the model-server pods",
    )
    p.add_argument(
        "--endpoint-target-ports",
        type=_ports,
        default=(),
        help="standalone mode: comma-separated target ports (1-8)",
    )
    p.add_argument(
        "--kubeconfig",
        default="",
        help="kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config)",
    )
    p.add_argument(
        "--objectives-file",
        action="append",
        default=[],
        metavar="PATH[,PATH]",
        help="YAML file(s) of InferenceObjective / InferenceModelRewrite objects, reloaded "
        "when changed (repeatable or comma-separated; any mode)",
    )
    p.add_argument(
        "--objectives-poll-interval",
        type=_duration,
        default=1.0,
        help="how often --objectives-file files are checked for changes (default 1s)",
    )
    p.add_argument(
        "--ha-lease-duration",
        type=_duration,
        default=15.0,
        help="leader election: lease duration (default 15s)",
    )
    p.add_argument(
        "--ha-renew-deadline",
        type=_duration,
        default=10.0,
        help="leader election: the leader steps down when it could not renew for this long "
        "(default 10s)",
    )
    p.add_argument(
        "--ha-retry-period",
        type=_duration,
        default=2.0,
        help="leader election: interval between acquire/renew attempts (default 2s)",
    )
    p.add_argument("--config-file", default="", help="EndpointPickerConfig YAML file")
    p.add_argument("--config-text", default="", help="EndpointPickerConfig YAML text")
    flag("disable-endpoint-subset-filter", False, "ignore the data plane's subset hint")
    flag("emit-endpoint-scores", False, "add per-endpoint scores to the envoy.lb metadata")
    flag("allow-experimental-plugins", False, "allow alpha plugins")
    flag("ha-enable-leader-election", False, "leader election between replicas")
    flag("secure-serving", True, "serve ext_proc over TLS (self-signed without --cert-path)")
    p.add_argument("--cert-path", default="", help="directory with tls.crt and tls.key")
    flag("enable-cert-reload", False, "reload the certificate when it changes (not yet)")
    flag("health-checking", False, "also serve grpc.health.v1 on the ext_proc port")
    flag("tracing", True, "OpenTelemetry tracing (accepted; tracing is not exported yet)")
    flag("enable-pprof", True, "accepted for compatibility; no effect")
    flag("metrics-endpoint-auth", True, "accepted for compatibility (no Kubernetes authn here)")
    flag("enable-grpc-stream-metrics", False, "accepted for compatibility")
    p.add_argument(
        "--drain-timeout",
        type=_duration,
        default=30.0,
        help="drain window after SIGTERM (default 30s)",
    )
    p.add_argument(
        "--refresh-metrics-interval",
        type=_duration,
        default=0.05,
        help="scrape interval per endpoint (default 50ms, minimum 50ms)",
    )
    p.add_argument(
        "--refresh-prometheus-metrics-interval",
        type=_duration,
        default=5.0,
        help="pool gauge refresh (default 5s)",
    )
    p.add_argument(
        "--metrics-staleness-threshold",
        type=_duration,
        default=2.0,
        help="age after which an endpoint's metrics count as stale (default 2s)",
    )
    p.add_argument(
        "--grpc-max-recv-msg-size",
        type=_quantity,
        default=64 << 20,
        help="largest gRPC message accepted (default 64MiB)",
    )
    p.add_argument(
        "--grpc-max-send-msg-size",
        type=_quantity,
        default=64 << 20,
        help="largest gRPC message sent (default 64MiB)",
    )
    p.add_argument(
        "--max-request-body-bytes",
        type=_quantity,
        default=64 << 20,
        help="request bodies above this get a 413 (default 64MiB)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed the scheduler's random source")
    p.add_argument(
        "-v",
        "--v",
        type=int,
        default=2,
        dest="v",
        help="log verbosity (2 default, 3 verbose, 4 debug, 5 trace)",
    )
    for zap in ("zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding"):
        p.add_argument(f"--{zap}", default="", help="controller-runtime logging flag")
    p.add_argument(
        "--zap-devel",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="controller-runtime logging flag",
    )
    for name in _REJECTED:
        p.add_argument(f"--{name}", default=None, help=argparse.SUPPRESS)
    return p


def _normalise(argv: Sequence[str]) -> list[str]:
    """Accept Go's single-dash long flags (``-grpc-port=1``)."""
    out = []
    for arg in argv:
        if arg.startswith("-") and not arg.startswith("--") and len(arg.split("=")[0]) > 2:
            arg = "-" + arg
        out.append(arg)
    return out


def settings_from_args(argv: Sequence[str]) -> Settings:
    parser = build_parser()
    a = parser.parse_args(_normalise(argv))
    for name, metric in _REJECTED.items():
        if getattr(a, name.replace("-", "_")) is not None:
            parser.error(
                f"--{name} is no longer supported; set {metric} through "
                "core-metrics-extractor engineConfigs instead"
            )
    if a.config_file and a.config_text:
        parser.error("--config-file and --config-text are mutually exclusive")
    config_text: str | None = a.config_text or None
    if a.config_file:
        try:
            with open(a.config_file, encoding="utf-8") as f:
                config_text = f.read()
        except OSError as exc:
            parser.error(f"--config-file: {exc}")
    _check_kubernetes_flags(parser, a)
    return Settings(
        grpc_port=a.grpc_port,
        grpc_health_port=a.grpc_health_port,
        metrics_port=a.metrics_port,
        bind_address=a.bind_address,
        config_text=config_text,
        pool_name=a.pool_name,
        pool_namespace=a.pool_namespace or os.environ.get("NAMESPACE", "default"),
        pool_group=a.pool_group,
        endpoint_selector=a.endpoint_selector,
        endpoint_target_ports=a.endpoint_target_ports,
        pod_name=os.environ.get("POD_NAME", ""),
        kubeconfig=a.kubeconfig,
        objectives_files=tuple(
            p.strip() for arg in a.objectives_file for p in arg.split(",") if p.strip()
        ),
        objectives_poll_interval=a.objectives_poll_interval,
        ha_enable_leader_election=a.ha_enable_leader_election,
        ha_lease_duration=a.ha_lease_duration,
        ha_renew_deadline=a.ha_renew_deadline,
        ha_retry_period=a.ha_retry_period,
        secure_serving=a.secure_serving,
        cert_path=a.cert_path,
        refresh_metrics_interval=max(a.refresh_metrics_interval, 0.05),
        refresh_prometheus_metrics_interval=a.refresh_prometheus_metrics_interval,
        metrics_staleness_threshold=a.metrics_staleness_threshold,
        drain_timeout=a.drain_timeout,
        grpc_max_recv_msg_size=a.grpc_max_recv_msg_size,
        grpc_max_send_msg_size=a.grpc_max_send_msg_size,
        max_request_body_bytes=a.max_request_body_bytes,
        emit_endpoint_scores=a.emit_endpoint_scores,
        disable_endpoint_subset_filter=a.disable_endpoint_subset_filter,
        allow_experimental_plugins=a.allow_experimental_plugins,
        health_checking=a.health_checking,
        verbosity=a.v,
        log_json=a.zap_encoder == "json",
        seed=a.seed,
    )


def _check_kubernetes_flags(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Mode flags (spec §2): at most one of --pool-name / --endpoint-selector; standalone needs
    target ports; leader election needs a Kubernetes mode."""
    if a.pool_name and a.endpoint_selector:
        parser.error("--pool-name and --endpoint-selector are mutually exclusive")
    if a.endpoint_selector:
        from epp.k8s.selector import parse_selector

        try:
            parse_selector(a.endpoint_selector)
        except ValueError as exc:
            parser.error(f"--endpoint-selector: {exc}")
        if not a.endpoint_target_ports:
            parser.error("--endpoint-selector needs --endpoint-target-ports")
    elif a.endpoint_target_ports:
        parser.error("--endpoint-target-ports is only used with --endpoint-selector")
    if a.ha_enable_leader_election:
        if not (a.pool_name or a.endpoint_selector):
            parser.error(
                "--ha-enable-leader-election needs Kubernetes mode "
                "(--pool-name or --endpoint-selector)"
            )
        if not 0 < a.ha_retry_period < a.ha_renew_deadline < a.ha_lease_duration:
            parser.error(
                "leader election needs 0 < --ha-retry-period < --ha-renew-deadline < "
                "--ha-lease-duration"
            )


def _setup_logging(settings: Settings) -> None:
    level = logging.DEBUG if settings.verbosity >= 4 else logging.INFO
    if settings.log_json:
        fmt = '{"ts":"%(asctime)s","level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}'
    else:
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr)


async def _serve(settings: Settings) -> None:
    from epp.app import App

    app = App(settings)
    app.install_signal_handlers()
    await app.run()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _SUBCOMMANDS:
        return _SUBCOMMANDS[args[0]](args[1:])
    settings = settings_from_args(args)
    _setup_logging(settings)
    from epp.config.loader import ConfigError
    from epp.plugin import PluginError

    try:
        asyncio.run(_serve(settings))
    except (ConfigError, PluginError) as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _plugins(args: list[str]) -> int:
    from epp.plugin import PluginError
    from epp.plugin.registry import PluginRegistry

    if args[:1] != ["list"]:
        print("usage: epp plugins list", file=sys.stderr)
        return 2
    try:
        reg = PluginRegistry.from_entry_points()
    except PluginError as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return 2
    rows = [
        (t, reg.info(t).distribution, reg.info(t).version, reg.info(t).target) for t in reg.types()
    ]
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'TYPE':<{width}}  DISTRIBUTION VERSION TARGET")
    for t, dist, ver, target in rows:
        print(f"{t:<{width}}  {dist} {ver} {target}")
    return 0


def _sim(args: list[str]) -> int:
    from epp.sim.cli import main as sim_main

    return sim_main(args)


def _stack(args: list[str]) -> int:
    from epp.localstack.cli import main as stack_main

    return stack_main(args)


def _bench(args: list[str]) -> int:
    from epp.bench.cli import main as bench_main

    return bench_main(args)


_SUBCOMMANDS = {"plugins": _plugins, "sim": _sim, "stack": _stack, "bench": _bench}
