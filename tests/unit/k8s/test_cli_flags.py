"""Kubernetes-mode flags of ``epp``: accepted forms, defaults, and the combinations refused."""

from __future__ import annotations

from typing import Any

import pytest

from epp.cli import settings_from_args


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["--pool-name", "p"],
            {"pool_name": "p", "pool_namespace": "default", "ha_enable_leader_election": False},
            id="pool-mode",
        ),
        pytest.param(
            ["--endpoint-selector=app=vllm", "--endpoint-target-ports=8000,8001,8000"],
            {"endpoint_selector": "app=vllm", "endpoint_target_ports": (8000, 8001)},
            id="standalone",
        ),
        pytest.param(
            [
                "--pool-name=p",
                "--ha-enable-leader-election",
                "--ha-lease-duration=2s",
                "--ha-renew-deadline=1500ms",
                "--ha-retry-period=250ms",
            ],
            {
                "ha_enable_leader_election": True,
                "ha_lease_duration": 2.0,
                "ha_renew_deadline": 1.5,
                "ha_retry_period": 0.25,
            },
            id="leader-election",
        ),
        pytest.param(
            ["--objectives-file", "a.yaml,b.yaml", "--objectives-file=c.yaml"],
            {"objectives_files": ("a.yaml", "b.yaml", "c.yaml"), "pool_name": ""},
            id="objectives-files",
        ),
        pytest.param(
            ["-kubeconfig=/k", "--pool-name=p"], {"kubeconfig": "/k"}, id="go-style-kubeconfig"
        ),
    ],
)
def test_flags_fill_settings_when_valid(argv: list[str], expected: dict[str, Any]) -> None:
    settings = settings_from_args(argv)
    assert {k: getattr(settings, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(
            ["--pool-name=p", "--endpoint-selector=a=b", "--endpoint-target-ports=1"],
            "mutually exclusive",
            id="both-modes",
        ),
        pytest.param(["--endpoint-selector=a=b"], "needs --endpoint-target-ports", id="no-ports"),
        pytest.param(["--endpoint-target-ports=8000"], "only used with", id="ports-alone"),
        pytest.param(
            ["--endpoint-selector=a in (", "--endpoint-target-ports=1"],
            "--endpoint-selector",
            id="bad-selector",
        ),
        pytest.param(["--ha-enable-leader-election"], "needs Kubernetes mode", id="ha-no-k8s"),
        pytest.param(
            ["--pool-name=p", "--ha-enable-leader-election", "--ha-renew-deadline=20s"],
            "--ha-renew-deadline < --ha-lease-duration",
            id="ha-timings",
        ),
        pytest.param(
            ["--endpoint-selector=a=b", "--endpoint-target-ports=70000"], "1..65535", id="port"
        ),
    ],
)
def test_flags_are_refused_when_inconsistent(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        settings_from_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_refused_combination_prints_the_usage_and_one_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        settings_from_args(["--pool-name", "x", "--endpoint-selector", "a=b"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: epp [-h]")
    assert err.splitlines()[-1] == (
        "epp: error: --pool-name and --endpoint-selector are mutually exclusive"
    )


def test_pool_namespace_defaults_to_the_namespace_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NAMESPACE", "team-a")
    assert settings_from_args(["--pool-name=p"]).pool_namespace == "team-a"
    monkeypatch.delenv("NAMESPACE")
    assert settings_from_args(["--pool-name=p"]).pool_namespace == "default"
