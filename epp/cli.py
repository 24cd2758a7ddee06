"""Command line: upstream's flags, names and defaults (spec §2), plus a few subcommands.

``epp [flags]`` runs the EPP; with ``--workers N`` above 1 it runs a supervisor of N EPP
processes (``epp.workers``). ``epp --version`` prints the installed package's version. ``epp
plugins list`` lists the installed plugins. ``epp sim`` runs the model-server simulator, ``epp
stack`` the local demo stack and ``epp bench`` the benchmarks: these three are the tools, a
distribution of their own (``tools/``), loaded only when asked for.

Boolean flags accept ``--flag``, ``--flag=true`` and ``--flag=false``; durations take Go syntax
(``50ms``, ``30s``); sizes take quantities (``10MiB``); single-dash long flags (``-grpc-port``)
are accepted as Go's flag package does. The flags themselves are declared once, as fields of
``epp.settings.Settings``; this module turns them into an argparse parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from epp.eventloop import run
from epp.observability.logs import LogConfig, configure, log_config
from epp.settings import Flag, Settings, SettingsError, flags

log = logging.getLogger("epp.cli")

_REJECTED = {
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
}
"""Upstream's removed metric flags: still parsed, so that using one gets a pointed error."""


def _argparse_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` with a ``SettingsError`` shown as is; other ``ValueError``s keep argparse's
    "invalid <name> value: '…'" message, so the wrapper keeps ``parse``'s name."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except SettingsError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = getattr(parse, "__name__", "value")
    return convert


class _Concatenate(argparse.Action):
    """A repeatable flag whose values are tuples: every occurrence adds to the tuple."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, (*getattr(namespace, self.dest, ()), *(values or ())))


def _add_flag(parser: argparse._ActionsContainer, dest: str, default: Any, spec: Flag) -> None:
    kwargs: dict[str, Any] = {
        "dest": dest,
        "default": default,
        "type": _argparse_type(spec.kind.parse),
        "metavar": spec.metavar,
        "help": spec.help,
    }
    if spec.kind.optional_value:
        kwargs.update(nargs="?", const=True)
    if spec.kind.repeat:
        kwargs.update(action=_Concatenate)
    parser.add_argument(*spec.option_strings, **kwargs)


FLAG_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "serving",
        (
            "grpc-port", "grpc-health-port", "metrics-port", "health-checking", "drain-timeout",
            "grpc-max-recv-msg-size", "grpc-max-send-msg-size",
        ),
    ),
    (
        "configuration and scheduling",
        (
            "config-file", "config-text", "allow-experimental-plugins",
            "disable-endpoint-subset-filter", "emit-endpoint-scores", "refresh-metrics-interval",
            "refresh-prometheus-metrics-interval", "metrics-staleness-threshold",
        ),
    ),
    (
        "Kubernetes",
        (
            "pool-name", "pool-namespace", "pool-group", "endpoint-selector",
            "endpoint-target-ports", "kubeconfig", "ha-enable-leader-election",
            "ha-lease-duration", "ha-renew-deadline", "ha-retry-period",
        ),
    ),
    (
        "TLS and auth",
        (
            "secure-serving", "cert-path", "enable-cert-reload", "tls-min-version",
            "tls-cipher-suites", "metrics-endpoint-auth", "metrics-cert-dir",
            "metrics-client-ca-file",
        ),
    ),
    (
        "observability",
        (
            "tracing", "enable-pprof", "enable-grpc-stream-metrics", "v", "zap-encoder",
            "zap-log-level", "zap-stacktrace-level", "zap-time-encoding", "zap-devel",
        ),
    ),
    ("flow control", ("flow-control-pool-wide-max-requests", "flow-control-pool-wide-priority")),
    (
        "ours (not in llm-d's EPP)",
        (
            "bind-address", "objectives-file", "objectives-poll-interval", "admin-token-file",
            "grpc-client-ca-file", "tracing-plugin-threshold", "enable-debug-endpoints",
            "workers", "max-request-body-bytes", "response-body-sample-ratio",
            "memory-trim-interval", "event-loop", "seed",
        ),
    ),
)  # fmt: skip
"""``epp --help``'s flag groups, in order; every flag is in exactly one (a test checks it)."""

SUBCOMMANDS_HELP: tuple[tuple[str, str], ...] = (
    ("plugins list", "the installed plugin types, built-in and third-party"),
    ("envoy-config", "an Envoy bootstrap, filter or Istio EnvoyFilter for this EPP"),
    ("explain", "how the running EPP would route a request, every score shown"),
    ("endpoints", "the running EPP's endpoints and their scraped metrics"),
    ("state", "the running EPP's plugin state, queues and sharing"),
    ("sim", "a simulated vLLM/SGLang fleet (tools)"),
    ("stack", "Envoy, the EPP and simulated pods on this machine, with a workload (tools)"),
    ("bench", "side-by-side benchmarks and failure scenarios (tools)"),
)


def package_version() -> str:
    """The installed ``inference-epp`` distribution's version (its package metadata)."""
    try:
        return importlib.metadata.version("inference-epp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    """The ``epp`` parser: one flag per ``Settings`` field declared with ``flag`` (its
    destination is the field name), plus the rejected legacy metric flags."""
    width = max(len(name) for name, _ in SUBCOMMANDS_HELP)
    subcommands = "\n".join(f"  epp {n:<{width}}  {text}" for n, text in SUBCOMMANDS_HELP)
    p = argparse.ArgumentParser(
        prog="epp",
        description="Endpoint Picker for LLM inference (Envoy ext_proc), a drop-in for llm-d's "
        "EPP: same flags, config and plugin types.",
        epilog=f"subcommands (each with --help):\n{subcommands}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"epp {package_version()}")
    by_name = {spec.name: (field, spec) for field, spec in flags()}
    for title, names in FLAG_GROUPS:
        group = p.add_argument_group(title)
        for name in names:
            field, spec = by_name.pop(name)
            _add_flag(group, field.name, field.default, spec)
    other = p.add_argument_group("other")  # empty unless a new flag was left out of the groups
    for field, spec in by_name.values():
        _add_flag(other, field.name, field.default, spec)
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
    """Parse ``argv`` into validated ``Settings``; exits with argparse's usage error (code 2)
    when a flag or a combination of flags is refused."""
    parser = build_parser()
    a = parser.parse_args(_normalise(argv))
    for name, metric in _REJECTED.items():
        if getattr(a, name.replace("-", "_")) is not None:
            parser.error(
                f"--{name} is no longer supported; set {metric} through "
                "core-metrics-extractor engineConfigs instead"
            )
    settings = Settings.from_command_line(
        {field.name: getattr(a, field.name) for field, _ in flags()}, os.environ
    )
    config_text = None
    if settings.config_file and not settings.config_text:  # both: validate() refuses it
        try:
            with open(settings.config_file, encoding="utf-8") as f:
                config_text = f.read()
        except OSError as exc:
            parser.error(f"--config-file: {exc}")
    try:
        settings.validate()
        _log_config(settings)
    except (SettingsError, ValueError) as exc:
        parser.error(str(exc))
    if config_text is None:
        return settings
    # config_text is what App loads; clearing config_file keeps the result valid.
    return dataclasses.replace(settings, config_file="", config_text=config_text)


def compat_flags_given(argv: Sequence[str]) -> list[Flag]:
    """The compatibility-only flags (``Flag.compat``) that ``argv`` gives."""
    given = {a.split("=", 1)[0] for a in _normalise(argv) if a.startswith("-")}
    return [spec for _, spec in flags() if spec.compat and given & set(spec.option_strings)]


def warn_compat(argv: Sequence[str]) -> None:
    """One startup warning per compatibility-only flag given: it is accepted and does nothing."""
    for spec in compat_flags_given(argv):
        log.warning(
            "--%s is accepted for compatibility and has no effect: %s", spec.name, spec.compat
        )


def _log_config(settings: Settings, worker: int | None = None) -> LogConfig:
    config = log_config(
        verbosity=settings.verbosity,
        zap_devel=settings.zap_devel,
        zap_encoder=settings.zap_encoder,
        zap_log_level=settings.zap_log_level,
        zap_stacktrace_level=settings.zap_stacktrace_level,
        zap_time_encoding=settings.zap_time_encoding,
    )
    return dataclasses.replace(config, worker=worker)


def idle_flags(s: Settings) -> list[str]:
    """Working flags set where they have nothing to act on; each gets a startup warning."""
    tls = s.secure_serving or bool(s.metrics_cert_dir)
    files = (s.secure_serving and s.cert_path) or s.metrics_cert_dir
    checks = (
        ("--enable-cert-reload", s.enable_cert_reload and not files,
         "without --cert-path or --metrics-cert-dir (a generated certificate never changes)"),
        ("--tls-min-version", bool(s.tls_min_version) and not tls, "without TLS"),
        ("--tls-cipher-suites", bool(s.tls_cipher_suites) and not tls, "without TLS"),
    )  # fmt: skip
    return [f"{name} has no effect {why}" for name, idle, why in checks if idle]


def setup_logging(settings: Settings, *, worker: int | None = None) -> None:
    """Zap-style log lines on stderr (``epp.observability.logs``); a worker of ``--workers N``
    names itself in each line."""
    configure(_log_config(settings, worker))


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
    setup_logging(settings)
    warn_compat(args)
    for message in idle_flags(settings):
        log.warning("%s", message)
    if settings.workers > 1:
        from epp.workers.supervisor import supervise

        return supervise(settings)
    from epp.config.loader import ConfigError
    from epp.plugin import PluginError

    try:
        run(_serve(settings), settings.event_loop)
    except (ConfigError, PluginError) as exc:
        return _startup_failed(settings, [exc])
    except BaseExceptionGroup as group:  # a start-up error raised inside the App's task group
        leaves = _leaves(group)
        if not all(isinstance(e, (ConfigError, PluginError)) for e in leaves):
            raise
        return _startup_failed(settings, leaves)
    except KeyboardInterrupt:
        return 130
    return 0


def _startup_failed(settings: Settings, reasons: Sequence[BaseException]) -> int:
    """Exit code 2 with the reasons: one line each, a JSON log line with a JSON encoder."""
    for reason in reasons:
        if settings.log_json:
            logging.getLogger("epp").error("start-up failed", extra={"reason": str(reason)})
        else:
            print(f"epp: {reason}", file=sys.stderr)
    return 2


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


def _plugins(args: list[str]) -> int:
    from epp.plugin import PluginError
    from epp.plugin.registry import PluginRegistry, clash_message

    if args[:1] != ["list"] or args[1:] not in ([], ["--markdown"]):
        print("usage: epp plugins list [--markdown]", file=sys.stderr)
        return 2
    try:
        reg = PluginRegistry.from_entry_points(strict=False)
    except PluginError as exc:
        print(f"epp: {exc}", file=sys.stderr)
        return 2
    for type_name, claims in reg.clashes().items():
        print(f"epp: {clash_message(type_name, claims)}; the EPP refuses to start until one of "
              "them is uninstalled", file=sys.stderr)  # fmt: skip
    if args[1:] == ["--markdown"]:
        from epp.config.catalog import render_markdown

        print(render_markdown(reg), end="")
        return 0
    rows = [
        (t, reg.info(t).distribution, reg.info(t).version, reg.info(t).target) for t in reg.types()
    ]
    rows += [(t, c.distribution, c.version, f"{c.target} CLASH")
             for t, claims in reg.clashes().items() for c in claims]  # fmt: skip
    width = max((len(r[0]) for r in rows), default=4)
    print(f"{'TYPE':<{width}}  DISTRIBUTION VERSION TARGET")
    for t, dist, ver, target in sorted(rows):
        print(f"{t:<{width}}  {dist} {ver} {target}")
    return 0


TOOLS: dict[str, str] = {
    "sim": "epp_tools.sim.cli",
    "stack": "epp_tools.stack.cli",
    "bench": "epp_tools.bench.cli",
}
"""The subcommands of the tools distribution (``inference-epp-tools``, ``tools/`` in the
repository): the module whose ``main(argv)`` runs each, imported only when it is asked for."""

TOOLS_HINT = "pip install -e ./tools"


def _tool(name: str) -> Callable[[list[str]], int]:
    def run(args: list[str]) -> int:
        try:
            module = importlib.import_module(TOOLS[name])
        except ModuleNotFoundError as exc:
            if exc.name != "epp_tools":
                raise  # the tools are installed, something they need is not
            print(
                f"epp {name} is one of the EPP's tools, which are not installed here; install "
                f"them from the repository with: {TOOLS_HINT}",
                file=sys.stderr,
            )
            return 2
        return int(module.main(args))

    return run


def _envoy_config(args: list[str]) -> int:
    from epp.envoyconfig.cli import main as envoy_config_main

    return envoy_config_main(args)


def _explain(args: list[str]) -> int:
    from epp.adminclient.cli import explain_main

    return explain_main(args)


def _endpoints(args: list[str]) -> int:
    from epp.adminclient.cli import endpoints_main

    return endpoints_main(args)


def _state(args: list[str]) -> int:
    from epp.adminclient.cli import state_main

    return state_main(args)


def _worker(args: list[str]) -> int:
    """Internal: one worker of ``--workers N``, started by the supervisor (``epp.workers``)."""
    from epp.workers.worker import main as worker_main

    if args:
        print("epp _worker is started by 'epp --workers N' and takes no arguments", file=sys.stderr)
        return 2
    return worker_main(setup_logging)


_SUBCOMMANDS = {
    "plugins": _plugins,
    "sim": _tool("sim"),
    "stack": _tool("stack"),
    "bench": _tool("bench"),
    "envoy-config": _envoy_config,
    "explain": _explain,
    "endpoints": _endpoints,
    "state": _state,
    "_worker": _worker,
}
