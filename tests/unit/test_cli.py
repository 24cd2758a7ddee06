from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from epp.cli import _REJECTED, build_parser, main, settings_from_args
from epp.settings import (
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
    Settings,
    SettingsError,
    flag_of,
    flags,
)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param([], True, id="default-true"),
        pytest.param(["--secure-serving"], True, id="bare"),
        pytest.param(["--secure-serving=false"], False, id="equals-false"),
        pytest.param(["--secure-serving=true"], True, id="equals-true"),
        pytest.param(["-secure-serving=false"], False, id="go-single-dash"),
    ],
)
def test_boolean_flags_accept_go_forms(args: list[str], expected: bool) -> None:
    assert settings_from_args(args).secure_serving is expected


def test_upstream_defaults() -> None:
    s = settings_from_args([])
    assert (s.grpc_port, s.grpc_health_port, s.metrics_port) == (9002, 9003, 9090)
    assert s.refresh_metrics_interval == 0.05
    assert s.drain_timeout == 30.0
    assert s.config_text is None


@pytest.mark.parametrize(
    ("args", "attr", "value"),
    [
        pytest.param(
            ["--refresh-metrics-interval", "200ms"],
            "refresh_metrics_interval",
            0.2,
            id="duration-ms",
        ),
        pytest.param(
            ["--refresh-metrics-interval=10ms"],
            "refresh_metrics_interval",
            0.05,
            id="clamped-to-50ms",
        ),
        pytest.param(["--drain-timeout", "1m30s"], "drain_timeout", 90.0, id="duration-compound"),
        pytest.param(
            ["--grpc-max-recv-msg-size", "10MiB"],
            "grpc_max_recv_msg_size",
            10 << 20,
            id="quantity-mib",
        ),
        pytest.param(
            ["--grpc-max-recv-msg-size", "25MB"],
            "grpc_max_recv_msg_size",
            25_000_000,
            id="quantity-mb",
        ),
        pytest.param(["-v", "4"], "verbosity", 4, id="verbosity"),
        pytest.param(["--emit-endpoint-scores"], "emit_endpoint_scores", True, id="scores"),
    ],
)
def test_flag_values(args: list[str], attr: str, value: object) -> None:
    assert getattr(settings_from_args(args), attr) == value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--config-file", "a", "--config-text", "b"], "mutually exclusive", id="config-both"
        ),
        pytest.param(
            ["--total-queued-requests-metric", "x"],
            "no longer supported",
            id="deprecated-metric-flag",
        ),
        pytest.param(["--drain-timeout", "soon"], "invalid duration", id="bad-duration"),
        pytest.param(["--secure-serving=maybe"], "invalid boolean", id="bad-bool"),
        pytest.param(
            ["--response-body-sample-ratio", "1.5"], "a fraction from 0 to 1", id="bad-fraction"
        ),
    ],
)
def test_bad_flags_exit_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(args)
    assert message in capsys.readouterr().err


def test_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n")
    assert settings_from_args(["--config-file", str(path)]).config_text == path.read_text()


# --- Settings is the one declaration of every flag -------------------------------------------

NOT_FLAGS = {"log_json", "pod_name", "kube_watch_timeout", "group_member", "metrics_token"}


def _samples(spec: Flag, default: object) -> tuple[str, object]:
    """A command-line value for a flag of this kind and what it parses to (never the default)."""
    if spec.kind is BOOL:
        return str(not default).lower(), not default
    table: dict[Kind, tuple[str, object]] = {
        TEXT: ("x", "x"),
        OPTIONAL_TEXT: ("x", "x"),
        INT: ("7", 7),
        DURATION: ("1m30s", 90.0),
        FRACTION: ("0.5", 0.5),
        QUANTITY: ("1Ki", 1024),
        PORTS: ("81,82", (81, 82)),
        PATHS: ("a,b", ("a", "b")),
        NAMES: ("a,b", ("a", "b")),
    }
    return table[spec.kind]


def test_the_parser_has_exactly_the_flags_settings_declares() -> None:
    declared = {opt for _, spec in flags() for opt in spec.option_strings}
    special = {"-h", "--help", "--version"} | {f"--{name}" for name in _REJECTED}
    parsed = {opt for action in build_parser()._actions for opt in action.option_strings}
    assert parsed - special == declared
    assert "--objectives-file" in declared and {"-v", "--v"} <= declared


def test_every_settings_field_but_a_few_is_a_flag() -> None:
    assert {f.name for f in dataclasses.fields(Settings) if flag_of(f) is None} == NOT_FLAGS


@pytest.mark.parametrize(("name", "spec"), [pytest.param(f.name, s, id=s.name) for f, s in flags()])
def test_a_flag_lands_in_its_field(name: str, spec: Flag) -> None:
    default = next(f.default for f in dataclasses.fields(Settings) if f.name == name)
    text, value = _samples(spec, default)
    assert value != default
    namespace = build_parser().parse_args([f"--{spec.name}={text}"])
    assert getattr(namespace, name) == value
    assert getattr(Settings(**{name: value}), name) == value


def _fields_of(s: Settings, expected: dict[str, Any]) -> dict[str, Any]:
    return {name: getattr(s, name) for name in expected}


def test_flags_accepted_for_compatibility_are_fields() -> None:
    argv = [
        "--tracing=false",
        "--enable-pprof=false",
        "--enable-cert-reload",
        "--metrics-endpoint-auth=false",
        "--zap-devel",
        "--zap-encoder=json",
        "--zap-log-level=debug",
    ]
    expected = {
        "tracing": False,
        "enable_pprof": False,
        "enable_cert_reload": True,
        "metrics_endpoint_auth": False,
        "enable_grpc_stream_metrics": False,
        "zap_devel": True,
        "zap_encoder": "json",
        "log_json": True,
        "zap_log_level": "debug",
    }
    assert _fields_of(settings_from_args(argv), expected) == expected


def test_the_environment_fills_namespace_and_pod_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAMESPACE", "team-a")
    monkeypatch.setenv("POD_NAME", "epp-5d8f9c-abcde")
    s = settings_from_args([])
    assert (s.pool_namespace, s.pod_name) == ("team-a", "epp-5d8f9c-abcde")
    assert settings_from_args(["--pool-namespace=b"]).pool_namespace == "b"


def test_settings_keep_their_keyword_defaults() -> None:
    expected = {
        "grpc_port": 9002,
        "grpc_health_port": 9003,
        "metrics_port": 9090,
        "bind_address": "0.0.0.0",
        "config_text": None,
        "pool_name": "",
        "pool_namespace": "",
        "pool_group": "inference.networking.k8s.io",
        "endpoint_selector": "",
        "endpoint_target_ports": (),
        "pod_name": "",
        "kubeconfig": "",
        "kube_watch_timeout": 300,
        "objectives_files": (),
        "objectives_poll_interval": 1.0,
        "ha_enable_leader_election": False,
        "ha_lease_duration": 15.0,
        "ha_renew_deadline": 10.0,
        "ha_retry_period": 2.0,
        "secure_serving": True,
        "cert_path": "",
        "refresh_metrics_interval": 0.05,
        "refresh_prometheus_metrics_interval": 5.0,
        "metrics_staleness_threshold": 2.0,
        "drain_timeout": 30.0,
        "workers": 1,
        "grpc_max_recv_msg_size": 4 << 20,
        "grpc_max_send_msg_size": 2**31 - 1,
        "max_request_body_bytes": 64 << 20,
        "emit_endpoint_scores": False,
        "disable_endpoint_subset_filter": False,
        "allow_experimental_plugins": False,
        "health_checking": False,
        "verbosity": 2,
        "log_json": False,
        "seed": None,
    }
    assert _fields_of(Settings(), expected) == expected
    Settings().validate()


def test_a_read_config_file_leaves_settings_that_still_validate(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("kind: EndpointPickerConfig\n")
    s = settings_from_args(["--config-file", str(path)])
    assert (s.config_file, s.config_text) == ("", path.read_text())
    s.validate()


def test_a_missing_config_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        settings_from_args(["--config-file", str(tmp_path / "none.yaml")])
    assert info.value.code == 2
    assert "epp: error: --config-file: [Errno 2] No such file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param(
            {"config_file": "a", "config_text": "b"},
            "--config-file and --config-text are mutually exclusive",
            id="config-both",
        ),
        pytest.param(
            {"pool_name": "p", "endpoint_selector": "a=b", "endpoint_target_ports": (1,)},
            "--pool-name and --endpoint-selector are mutually exclusive",
            id="both-modes",
        ),
        pytest.param(
            {"endpoint_selector": "a in (", "endpoint_target_ports": (1,)},
            "--endpoint-selector: label selector 'a in (': cannot parse 'a in ('",
            id="bad-selector",
        ),
        pytest.param(
            {"endpoint_selector": "a=b"},
            "--endpoint-selector needs --endpoint-target-ports",
            id="no-ports",
        ),
        pytest.param(
            {"endpoint_target_ports": (1,)},
            "--endpoint-target-ports is only used with --endpoint-selector",
            id="ports-alone",
        ),
        pytest.param(
            {"ha_enable_leader_election": True},
            "--ha-enable-leader-election needs Kubernetes mode "
            "(--pool-name or --endpoint-selector)",
            id="ha-no-k8s",
        ),
        pytest.param({"workers": 0}, "--workers must be 1..64", id="workers-zero"),
        pytest.param({"workers": 65}, "--workers must be 1..64", id="workers-too-many"),
        pytest.param(
            {"event_loop": "trio"},
            "--event-loop must be one of uvloop, asyncio",
            id="unknown-event-loop",
        ),
        pytest.param(
            {"memory_trim_interval": -5.0},
            "--memory-trim-interval must be 0 (off) or more",
            id="trim-negative",
        ),
        pytest.param(
            {"pool_name": "p", "ha_enable_leader_election": True, "workers": 2},
            "--workers above 1 and --ha-enable-leader-election are mutually exclusive: the "
            "workers of one host are one replica, and each would compete for the lease",
            id="workers-with-leader-election",
        ),
        *(
            pytest.param(
                {"pool_name": "p", "ha_enable_leader_election": True, **timings},
                "leader election needs 0 < --ha-retry-period < --ha-renew-deadline < "
                "--ha-lease-duration",
                id=f"ha-timings-{i}",
            )
            for i, timings in enumerate(
                [
                    {"ha_retry_period": 0.0},
                    {"ha_retry_period": 10.0},
                    {"ha_renew_deadline": 15.0},
                    {"ha_lease_duration": 1.0},
                ]
            )
        ),
    ],
)
def test_validate_refuses_each_inconsistent_combination(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}$"):
        Settings(**fields).validate()


@pytest.mark.parametrize(
    "fields",
    [
        {"pool_name": "p", "ha_enable_leader_election": True},
        {"endpoint_selector": "app in (a,b)", "endpoint_target_ports": (8000,)},
        {"config_text": "x", "ha_lease_duration": 1.0},
    ],
    ids=["pool-mode-with-leader-election", "standalone", "leader-election-off"],
)
def test_validate_accepts_consistent_settings(fields: dict[str, Any]) -> None:
    Settings(**fields).validate()


def test_settings_errors_are_value_errors() -> None:
    assert issubclass(SettingsError, ValueError)


def test_workers_without_a_syncer_exit_2_saying_how_to_configure_redis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from epp.cli import main

    config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
    assert main(["--workers", "2", "--config-text", config]) == 2
    err = capsys.readouterr().err
    assert "epp: --workers 2: the workers must share routing state" in err
    assert "crossReplicaSyncerPluginRef: redis-syncer" in err


def test_help_shows_workers_and_hides_the_internal_worker_subcommand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "--workers WORKERS" in out
    assert "_worker" not in out


@pytest.mark.parametrize("flag", ["--version", "-version"])
def test_version_prints_the_installed_package_version(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(__file__).resolve().parents[2]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exited:
        main([flag])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"epp {declared}\n"


def test_help_groups_every_flag_once_and_lists_the_subcommands(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from epp.cli import FLAG_GROUPS, SUBCOMMANDS_HELP, build_parser
    from epp.settings import flags

    grouped = [name for _, names in FLAG_GROUPS for name in names]
    assert sorted(grouped) == sorted(spec.name for _, spec in flags())
    assert len(grouped) == len(set(grouped))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    positions = [text.index(f"\n{title}:\n") for title, _ in FLAG_GROUPS]
    assert positions == sorted(positions)
    for name, _ in SUBCOMMANDS_HELP:
        assert f"  epp {name}" in text


_WITHOUT_TOOLS = """
import sys
from pathlib import Path

tools = Path(sys.argv[1]).resolve()
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != tools]
from epp.cli import main

sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("name", ["sim", "stack", "bench"])
def test_a_tool_subcommand_without_the_tools_says_how_to_install_them(name: str) -> None:
    """The service runs alone: without the tools distribution on the path (what a service-only
    install is), ``epp sim|stack|bench`` print one line saying how to install them, exit 2."""
    import subprocess
    import sys

    tools = Path(__file__).resolve().parents[2] / "tools"
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TOOLS, str(tools), name, "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert f"epp {name}" in line and "pip install -e ./tools" in line


def test_a_tool_subcommand_runs_the_installed_tool(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: epp sim")
