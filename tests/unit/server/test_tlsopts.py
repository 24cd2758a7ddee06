"""``--tls-min-version`` / ``--tls-cipher-suites`` parsing and the TLS flag rules
(``epp.server.tlsopts``): what each Go name means, and the exact refusal an operator reads."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from epp.server.tlsopts import openssl_ciphers, parse_tls_version, tls_problem


@dataclass(frozen=True)
class _Tls:
    secure_serving: bool = True
    tls_min_version: str = ""
    tls_cipher_suites: tuple[str, ...] = ()
    metrics_cert_dir: str = ""
    metrics_client_ca_file: str = ""
    metrics_endpoint_auth: bool = False
    grpc_client_ca_file: str = ""


def test_tls_versions_by_go_name() -> None:
    assert parse_tls_version("") is None
    assert parse_tls_version("VersionTLS10") is ssl.TLSVersion.TLSv1
    assert parse_tls_version("VersionTLS11") is ssl.TLSVersion.TLSv1_1
    assert parse_tls_version("VersionTLS12") is ssl.TLSVersion.TLSv1_2
    assert parse_tls_version("VersionTLS13") is ssl.TLSVersion.TLSv1_3


def test_an_unknown_tls_version_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError) as info:
        parse_tls_version("TLS1.3")
    assert str(info.value) == (
        "unknown TLS version 'TLS1.3'; supported values: VersionTLS10, VersionTLS11, "
        "VersionTLS12, VersionTLS13"
    )


def test_go_cipher_names_become_an_openssl_list() -> None:
    got = openssl_ciphers(
        [
            " TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ",
            "TLS_AES_128_GCM_SHA256",  # TLS 1.3: not configurable, skipped
            "",
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",  # Go's alias
            "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",  # the same suite again
            "TLS_RSA_WITH_AES_256_CBC_SHA",
        ]
    )
    assert got == "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-CHACHA20-POLY1305:AES256-SHA"
    assert openssl_ciphers(["TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"]) == ""
    assert openssl_ciphers([]) == ""
    assert openssl_ciphers(["TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"]) == (
        "ECDHE-ECDSA-CHACHA20-POLY1305"
    )


def test_an_unknown_cipher_is_named_as_given() -> None:
    with pytest.raises(ValueError) as info:
        openssl_ciphers(["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", " TLS_RSA_WITH_RC4_128_SHA"])
    assert str(info.value) == "unknown or unsupported cipher suite ' TLS_RSA_WITH_RC4_128_SHA'"


def test_defaults_fit_together() -> None:
    assert tls_problem(_Tls()) == ""
    assert tls_problem(_Tls(secure_serving=False)) == ""


def test_bad_names_are_reported_under_tls_flags() -> None:
    assert tls_problem(_Tls(tls_min_version="v9")) == (
        "--tls-*: unknown TLS version 'v9'; supported values: VersionTLS10, VersionTLS11, "
        "VersionTLS12, VersionTLS13"
    )
    assert tls_problem(_Tls(tls_cipher_suites=("NOPE",))) == (
        "--tls-*: unknown or unsupported cipher suite 'NOPE'"
    )


def test_a_tls13_minimum_fits_with_or_without_secure_serving() -> None:
    assert tls_problem(_Tls(tls_min_version="VersionTLS13")) == ""
    assert tls_problem(_Tls(tls_min_version="VersionTLS12")) == ""
    assert tls_problem(_Tls(tls_min_version="VersionTLS13", secure_serving=False)) == ""


def _cert_dir(tmp_path: Path) -> Path:
    d = tmp_path / "certs"
    d.mkdir()
    (d / "tls.crt").write_text("c")
    (d / "tls.key").write_text("k")
    return d


def test_metrics_tls_flag_rules(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("ca")
    certs = str(_cert_dir(tmp_path))
    base = _Tls()
    assert tls_problem(replace(base, metrics_client_ca_file=str(ca))) == (
        '"metrics-client-ca-file" requires "metrics-cert-dir"'
    )
    assert tls_problem(replace(base, metrics_cert_dir=certs)) == (
        '"metrics-cert-dir" enables metrics TLS without authentication; set '
        '"metrics-client-ca-file" or "metrics-endpoint-auth"'
    )
    assert tls_problem(replace(base, metrics_cert_dir=certs, metrics_endpoint_auth=True)) == ""
    assert tls_problem(replace(base, metrics_cert_dir=certs, metrics_client_ca_file=str(ca))) == ""


def test_grpc_client_ca_needs_secure_serving(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("ca")
    assert tls_problem(_Tls(secure_serving=False, grpc_client_ca_file=str(ca))) == (
        "--grpc-client-ca-file needs --secure-serving"
    )
    assert tls_problem(_Tls(grpc_client_ca_file=str(ca))) == ""


def test_every_named_file_must_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    assert tls_problem(_Tls(grpc_client_ca_file=missing)) == (
        f"metrics TLS cert file unreadable: {missing}"
    )
    certs = _cert_dir(tmp_path)
    (certs / "tls.key").unlink()
    s = _Tls(metrics_cert_dir=str(certs), metrics_endpoint_auth=True)
    assert tls_problem(s) == f"metrics TLS cert file unreadable: {certs / 'tls.key'}"
    (certs / "tls.crt").unlink()
    assert tls_problem(s) == f"metrics TLS cert file unreadable: {certs / 'tls.crt'}"
    s = _Tls(metrics_cert_dir=str(tmp_path), metrics_client_ca_file=missing)
    assert tls_problem(s) == f"metrics TLS cert file unreadable: {missing}"
