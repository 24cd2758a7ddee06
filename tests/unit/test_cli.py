from __future__ import annotations

import pytest

from epp.cli import settings_from_args


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
    ],
)
def test_bad_flags_exit_with_a_clear_message(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(args)
    assert message in capsys.readouterr().err


def test_config_file_is_read(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n")
    assert settings_from_args(["--config-file", str(path)]).config_text == path.read_text()
