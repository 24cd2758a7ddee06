"""The security flags' rules, and the audit of flags that do nothing: every flag is read by
the code, or is listed as compatibility-only and warns when given."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from epp.cli import compat_flags_given, idle_flags, settings_from_args, warn_compat
from epp.settings import COMPAT_ONLY, METRICS_TOKEN_ENV, flags

ROOT = Path(__file__).resolve().parents[2]


def _sources() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "epp").rglob("*.py")))


def test_every_flag_is_read_or_declared_compatibility_only() -> None:
    """A flag's field read anywhere (``.field``) does something; one never read must be in
    ``COMPAT_ONLY``, and one in ``COMPAT_ONLY`` must never be read."""
    text = _sources()
    unread, listed_but_read = [], []
    for field, spec in flags():
        read = re.search(rf"\.{field.name}\b", text) is not None
        if not read and spec.name not in COMPAT_ONLY:
            unread.append(spec.name)
        if read and spec.name in COMPAT_ONLY:
            listed_but_read.append(spec.name)
    assert unread == [], "flags accepted and ignored"
    assert listed_but_read == [], "flags that work are listed as compatibility-only"


def test_no_flag_is_compatibility_only_now() -> None:
    assert dict(COMPAT_ONLY) == {}
    assert {s.name for _, s in flags() if s.compat} == set()


def test_a_compatibility_only_flag_warns_when_given(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mechanism stays for the next flag kept only for compatibility."""
    monkeypatch.setattr("epp.settings.COMPAT_ONLY", {"zap-time-encoding": "not read"})
    argv = ["--zap-time-encoding=epoch"]
    settings_from_args(argv)  # accepted
    with caplog.at_level(logging.WARNING, logger="epp.cli"):
        warn_compat(argv)
    assert "--zap-time-encoding is accepted for compatibility" in caplog.text
    assert [s.name for s in compat_flags_given(["-zap-time-encoding=epoch"])] == [
        "zap-time-encoding"
    ]  # Go's single dash


def test_working_flags_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="epp.cli"):
        warn_compat(["--enable-pprof=false", "--enable-cert-reload", "--metrics-endpoint-auth"])
    assert caplog.records == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tls-min-version=TLS1.2"], "unknown TLS version 'TLS1.2'"),
        (["--tls-cipher-suites=FAKE_CIPHER_SUITE"], "unsupported cipher suite 'FAKE_CIPHER_SUITE'"),
        (["--metrics-client-ca-file=/etc/ca.crt"], '"metrics-client-ca-file" requires'),
        (
            ["--metrics-cert-dir=/tmp", "--metrics-endpoint-auth=false"],
            "enables metrics TLS without authentication",
        ),
        (["--metrics-cert-dir=/nonexistent-dir"], "metrics TLS cert file unreadable"),
        (["--grpc-client-ca-file=/etc/ca.crt", "--secure-serving=false"], "needs --secure-serving"),
        (["--grpc-client-ca-file=/nonexistent/ca.crt"], "cert file unreadable"),
    ],
)
def test_tls_flags_are_checked(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_tls_flags_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    monkeypatch.setenv(METRICS_TOKEN_ENV, "s3cr3t-7d1f")
    s = settings_from_args(
        [
            "--tls-min-version=VersionTLS12",
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "--tls-cipher-suites=TLS_AES_128_GCM_SHA256",
            f"--metrics-cert-dir={tmp_path}",
            "--secure-serving=false",
        ]
    )
    assert s.tls_cipher_suites == (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "TLS_AES_128_GCM_SHA256",
    )
    assert s.metrics_token == "s3cr3t-7d1f" and "s3cr3t" not in repr(s)
    assert settings_from_args(["--tls-min-version=VersionTLS13", "--secure-serving=false"])


def test_working_flags_with_nothing_to_act_on_are_named() -> None:
    assert idle_flags(settings_from_args(["--enable-cert-reload"])) == [
        "--enable-cert-reload has no effect without --cert-path or --metrics-cert-dir "
        "(a generated certificate never changes)"
    ]
    plain = settings_from_args(["--secure-serving=false", "--tls-min-version=VersionTLS12"])
    assert idle_flags(plain) == ["--tls-min-version has no effect without TLS"]
    assert idle_flags(settings_from_args(["--enable-cert-reload", "--cert-path=/c"])) == []
    assert idle_flags(settings_from_args([])) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--enable-cert-reload", "--cert-path=/c"],
        ["--enable-grpc-stream-metrics"],
        ["--tls-min-version=VersionTLS13"],
        ["--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"],
    ],
)
def test_every_tls_and_stream_option_is_accepted_with_the_one_ext_proc_server(
    argv: list[str],
) -> None:
    assert settings_from_args(argv).secure_serving


def test_the_removed_server_choice_is_an_unknown_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_args(["--ext-proc-server=h2"])
    assert "--ext-proc-server" in capsys.readouterr().err
