"""Server credentials: ``--cert-path`` (tls.crt/tls.key) or a self-signed certificate made at
start, as upstream does when ``--secure-serving`` is on without a certificate; the metrics
port's ``--metrics-cert-dir`` and ``--metrics-client-ca-file``.

With ``--enable-cert-reload`` a :class:`CertFiles` re-reads its directory every
``RELOAD_INTERVAL`` and takes a new pair once ``tls.crt`` and ``tls.key`` both parse and match
(a half-written rotation keeps the old pair). New connections get the new certificate without a
restart; open ones keep theirs: both servers' ``SSLContext`` (ext_proc and metrics) is loaded
again in place. The client CA files are read once, at start.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import os
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from epp.server.tlsopts import openssl_ciphers, parse_tls_version

log = logging.getLogger(__name__)

RELOAD_INTERVAL: Final = 1.0
"""Seconds between two reads of a reloaded certificate directory."""


def self_signed(common_name: str = "epp") -> tuple[bytes, bytes]:
    """(cert PEM, key PEM) valid for ten years."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


class CertFiles:
    """``tls.crt`` and ``tls.key`` of ``directory``: the pair in use and, when asked, a newer
    one. ``ValueError`` at construction when the files are missing or do not form a pair."""

    def __init__(self, directory: str) -> None:
        self.directory = Path(directory)
        pair = self._read()
        if isinstance(pair, str):
            raise ValueError(f"{directory}: {pair}")
        self.key, self.cert = pair
        self.generation = 0
        self.snapshot = (0, self.key, self.cert)
        """(generation, key, cert), replaced as one value: what another thread reads."""
        self._digest = _digest(pair)
        self._rejected = b""
        self._listeners: list[Callable[[bytes, bytes], None]] = []

    def on_change(self, listener: Callable[[bytes, bytes], None]) -> None:
        self._listeners.append(listener)

    def _read(self) -> tuple[bytes, bytes] | str:
        try:
            cert = (self.directory / "tls.crt").read_bytes()
            key = (self.directory / "tls.key").read_bytes()
            public = x509.load_pem_x509_certificate(cert).public_key()
            private = serialization.load_pem_private_key(key, password=None)
        except (OSError, ValueError, TypeError) as exc:
            return str(exc) or type(exc).__name__
        form = serialization.PublicFormat.SubjectPublicKeyInfo
        enc = serialization.Encoding.DER
        if private.public_key().public_bytes(enc, form) != public.public_bytes(enc, form):
            return "tls.key does not match tls.crt"
        return key, cert

    def check(self) -> bool:
        """Read the files again; True when a new, valid pair was taken."""
        pair = self._read()
        if isinstance(pair, str):
            if self._rejected != pair.encode():
                self._rejected = pair.encode()
                log.warning("certificate reload: keeping the old pair (%s)", pair)
            return False
        digest = _digest(pair)
        if digest == self._digest:
            return False
        self.key, self.cert = pair
        self._digest, self._rejected = digest, b""
        self.generation += 1
        self.snapshot = (self.generation, self.key, self.cert)
        for listener in self._listeners:
            listener(self.key, self.cert)
        log.info("certificate reloaded from %s", self.directory)
        return True

    async def watch(self, interval: float = RELOAD_INTERVAL) -> None:
        """Check the files every ``interval`` seconds, forever."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.check()
            except Exception as exc:  # a listener failing must not end the watch
                log.warning("certificate reload from %s failed: %r", self.directory, exc)


def _digest(pair: tuple[bytes, bytes]) -> bytes:
    return hashlib.sha256(pair[0] + b"\0" + pair[1]).digest()


def server_ssl_context(
    files: CertFiles | None,
    *,
    client_ca_file: str,
    min_version: str,
    cipher_suites: tuple[str, ...],
    alpn: tuple[str, ...] = (),
) -> ssl.SSLContext:
    """A server's TLS: at least TLS 1.2 (``min_version`` may raise it to 1.3),
    ``cipher_suites`` for TLS 1.2, verified client certificates required when
    ``client_ca_file`` is set, ``alpn`` offered. The pair is ``files``' (following its changes;
    whether they are watched is the caller's choice) or, without ``files``, a self-signed one.
    ``ssl.SSLError`` or ``OSError`` when a file does not load."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = max(
        ssl.TLSVersion.TLSv1_2, parse_tls_version(min_version) or ssl.TLSVersion.TLSv1_2
    )
    ciphers = openssl_ciphers(cipher_suites)
    if ciphers:
        ctx.set_ciphers(ciphers)
    if client_ca_file:
        ctx.load_verify_locations(cafile=client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    if files is None:
        cert, key = self_signed()
        load_pair(ctx, key, cert)
        return ctx
    load_pair(ctx, files.key, files.cert)
    files.on_change(lambda key, cert: load_pair(ctx, key, cert))
    return ctx


def load_pair(ctx: ssl.SSLContext, key: bytes, cert: bytes) -> None:
    """Load a PEM pair into ``ctx`` (OpenSSL takes files: a private temporary directory)."""
    with tempfile.TemporaryDirectory(prefix="epp-tls-") as tmp:
        cert_file, key_file = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
        with open(cert_file, "wb") as f:
            f.write(cert)
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(key)
        ctx.load_cert_chain(cert_file, key_file)


class MetricsTlsSettings(Protocol):
    """The options of the metrics port's TLS (``epp.settings.Settings`` has them)."""

    @property
    def metrics_cert_dir(self) -> str: ...

    @property
    def metrics_client_ca_file(self) -> str: ...

    @property
    def tls_min_version(self) -> str: ...

    @property
    def tls_cipher_suites(self) -> tuple[str, ...]: ...


def metrics_tls(s: MetricsTlsSettings) -> tuple[ssl.SSLContext | None, CertFiles | None]:
    """The metrics port's TLS context and certificate files; ``(None, None)`` for plain HTTP.
    ``ValueError`` when the files do not load."""
    if not s.metrics_cert_dir:
        return None, None
    files = CertFiles(s.metrics_cert_dir)
    try:
        ctx = server_ssl_context(
            files,
            client_ca_file=s.metrics_client_ca_file,
            min_version=s.tls_min_version,
            cipher_suites=s.tls_cipher_suites,
        )
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"metrics TLS: {exc}") from None
    return ctx, files
