"""Certificates and TLS contexts (``epp.server.tls``): the self-signed certificate, a
``--cert-path`` pair and its reload rules, and the metrics port's TLS context."""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from epp.server.tls import CertFiles, metrics_tls, self_signed, server_ssl_context
from tests.certs import CA


def test_the_self_signed_certificate_names_its_host_for_ten_years() -> None:
    cert_pem, key_pem = self_signed("epp.example")
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, password=None)
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    assert cn == "epp.example" and cert.issuer == cert.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["epp.example"]
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_valid_before_utc < now
    lifetime = cert.not_valid_after_utc - now
    assert datetime.timedelta(days=3649) < lifetime <= datetime.timedelta(days=3650)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert key.public_key().public_bytes(*spki) == cert.public_key().public_bytes(*spki)
    assert key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    default = x509.load_pem_x509_certificate(self_signed()[0])
    assert default.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "epp"


def test_a_directory_without_a_matching_pair_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        CertFiles(str(tmp_path))
    assert str(info.value).startswith(f"{tmp_path}: ")
    assert "tls.crt" in str(info.value)
    ca = CA()
    a, b = ca.leaf(), ca.leaf()
    (tmp_path / "tls.crt").write_bytes(a.cert)
    (tmp_path / "tls.key").write_bytes(b.key)
    with pytest.raises(ValueError) as info:
        CertFiles(str(tmp_path))
    assert str(info.value) == f"{tmp_path}: tls.key does not match tls.crt"


def test_check_takes_a_new_valid_pair_once(tmp_path: Path, caplog: Any) -> None:
    ca = CA()
    first = ca.leaf().write(tmp_path)
    files = CertFiles(str(first))
    original = (files.key, files.cert)
    assert files.snapshot == (0, *original) and files.generation == 0
    seen: list[tuple[bytes, bytes]] = []
    files.on_change(lambda key, cert: seen.append((key, cert)))
    assert files.check() is False  # unchanged
    leaf = ca.leaf()
    leaf.write(tmp_path)
    with caplog.at_level(logging.INFO, "epp.server.tls"):
        assert files.check() is True
    assert (files.key, files.cert) == (leaf.key, leaf.cert)
    assert files.generation == 1 and files.snapshot == (1, leaf.key, leaf.cert)
    assert seen == [(leaf.key, leaf.cert)]
    assert [r.getMessage() for r in caplog.records] == [f"certificate reloaded from {tmp_path}"]
    assert files.check() is False and files.generation == 1


def test_a_broken_rotation_keeps_the_pair_and_warns_once_per_problem(
    tmp_path: Path, caplog: Any
) -> None:
    ca = CA()
    leaf = ca.leaf()
    files = CertFiles(str(leaf.write(tmp_path)))
    (tmp_path / "tls.key").write_bytes(ca.leaf().key)  # half-written: new key, old cert
    with caplog.at_level(logging.WARNING, "epp.server.tls"):
        assert files.check() is False
        assert files.check() is False
    assert [r.getMessage() for r in caplog.records] == [
        "certificate reload: keeping the old pair (tls.key does not match tls.crt)"
    ]
    assert (files.key, files.cert, files.generation) == (leaf.key, leaf.cert, 0)
    new = ca.leaf()
    new.write(tmp_path)
    assert files.check() is True and files.generation == 1
    (tmp_path / "tls.key").write_bytes(ca.leaf().key)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "epp.server.tls"):
        assert files.check() is False  # the same problem again after a good pair: warned again
    assert len(caplog.records) == 1


async def test_watch_checks_every_interval_and_survives_a_failing_listener(
    tmp_path: Path, caplog: Any
) -> None:
    ca = CA()
    files = CertFiles(str(ca.leaf().write(tmp_path)))
    taken = {1: asyncio.Event(), 2: asyncio.Event()}

    def listener(key: bytes, cert: bytes) -> None:
        taken[files.generation].set()
        raise RuntimeError("listener broke")

    files.on_change(listener)
    task = asyncio.create_task(files.watch(0.01))
    try:
        with caplog.at_level(logging.WARNING, "epp.server.tls"):
            ca.leaf().write(tmp_path)
            await asyncio.wait_for(taken[1].wait(), 30)
            ca.leaf().write(tmp_path)  # the watch goes on after the listener failed
            await asyncio.wait_for(taken[2].wait(), 30)
    finally:
        task.cancel()
    failed = f"certificate reload from {tmp_path} failed: RuntimeError('listener broke')"
    assert [r.getMessage() for r in caplog.records].count(failed) == 2


@dataclass(frozen=True)
class _M:
    metrics_cert_dir: str = ""
    metrics_client_ca_file: str = ""
    tls_min_version: str = ""
    tls_cipher_suites: tuple[str, ...] = ()


def test_no_metrics_cert_dir_is_plain_http() -> None:
    assert metrics_tls(_M()) == (None, None)


def test_the_metrics_context_is_tls12_or_newer_with_verified_clients(tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    ctx, files = metrics_tls(_M(str(certs), str(tmp_path / "ca.pem")))
    assert ctx is not None and files is not None and files.directory == certs
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    ctx, _ = metrics_tls(_M(str(certs), tls_min_version="VersionTLS10"))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert ctx.verify_mode == ssl.CERT_NONE
    ctx, _ = metrics_tls(_M(str(certs), tls_min_version="VersionTLS13"))
    assert ctx is not None and ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_metrics_ciphers_restrict_tls12(tmp_path: Path) -> None:
    ca = CA()
    files = CertFiles(str(ca.leaf().write(tmp_path)))
    ctx = server_ssl_context(
        files,
        client_ca_file="",
        min_version="",
        cipher_suites=("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",),
    )
    tls12 = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES256-GCM-SHA384"}
    default = server_ssl_context(files, client_ca_file="", min_version="", cipher_suites=())
    assert len({c["name"] for c in default.get_ciphers() if c["protocol"] == "TLSv1.2"}) > 1


def test_a_bad_client_ca_is_a_metrics_tls_error(tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(ValueError) as info:
        metrics_tls(_M(str(certs), str(tmp_path / "ca.pem")))
    assert str(info.value).startswith("metrics TLS: ")


def test_the_metrics_context_follows_a_new_pair(tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path)
    ctx, files = metrics_tls(_M(str(certs), tls_min_version="VersionTLS12"))
    assert ctx is not None and files is not None
    loaded: list[bytes] = []
    original = ctx.load_cert_chain

    def spy(certfile: Any, keyfile: Any = None, password: Any = None) -> None:
        loaded.append(Path(certfile).read_bytes())
        original(certfile, keyfile)

    ctx.load_cert_chain = spy  # type: ignore[method-assign]
    new = ca.leaf()
    new.write(tmp_path)
    assert files.check() is True
    assert loaded == [new.cert]
