"""``--tls-min-version`` and ``--tls-cipher-suites``: upstream's Go names, parsed into what
OpenSSL (the ext_proc and metrics servers, both on Python's ``ssl``) understands.

- ``--tls-min-version``: ``VersionTLS10`` … ``VersionTLS13``. Neither server negotiates below
  TLS 1.2 (HTTP/2 forbids it for the ext_proc port, RFC 9113 §9.2), so ``VersionTLS10``,
  ``VersionTLS11`` and ``VersionTLS12`` all mean "TLS 1.2 or newer"; ``VersionTLS13`` refuses
  TLS 1.2 handshakes on both ports.
- ``--tls-cipher-suites``: Go ``crypto/tls`` names (``TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256``);
  they restrict TLS 1.2, as in Go. TLS 1.3 suite names are accepted and change nothing (TLS 1.3
  suites are not configurable, in Go either).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence
from typing import Final, Protocol

TLS_VERSIONS: Final = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}

GO_CIPHERS: Final = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
}
"""Go name → OpenSSL name of the TLS 1.2 suites both Go and BoringSSL offer."""

GO_ALIASES: Final = {
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
}
TLS13_SUITES: Final = frozenset(
    {"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"}
)


def parse_tls_version(name: str) -> ssl.TLSVersion | None:
    """``None`` for an empty name; ``ValueError`` (upstream's message) for an unknown one."""
    if not name:
        return None
    try:
        return TLS_VERSIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown TLS version {name!r}; supported values: VersionTLS10, VersionTLS11, "
            "VersionTLS12, VersionTLS13"
        ) from None


def openssl_ciphers(names: Sequence[str]) -> str:
    """The OpenSSL cipher list of Go suite names ("" when only TLS 1.3 names, or none, are
    given); ``ValueError`` names the first unknown suite."""
    out: list[str] = []
    for raw in names:
        name = GO_ALIASES.get(raw.strip(), raw.strip())
        if not name or name in TLS13_SUITES:
            continue
        if name not in GO_CIPHERS:
            raise ValueError(f"unknown or unsupported cipher suite {raw!r}")
        out.append(GO_CIPHERS[name])
    return ":".join(dict.fromkeys(out))


class TlsSettings(Protocol):
    """The TLS options of ``epp.settings.Settings``."""

    @property
    def secure_serving(self) -> bool: ...

    @property
    def tls_min_version(self) -> str: ...

    @property
    def tls_cipher_suites(self) -> tuple[str, ...]: ...

    @property
    def metrics_cert_dir(self) -> str: ...

    @property
    def metrics_client_ca_file(self) -> str: ...

    @property
    def metrics_endpoint_auth(self) -> bool: ...

    @property
    def grpc_client_ca_file(self) -> str: ...


def tls_problem(s: TlsSettings) -> str:
    """Why the TLS options do not fit together (upstream's rules and messages, spec §2), or
    ``""``."""
    try:
        parse_tls_version(s.tls_min_version)
        openssl_ciphers(s.tls_cipher_suites)
    except ValueError as exc:
        return f"--tls-*: {exc}"
    if s.metrics_client_ca_file and not s.metrics_cert_dir:
        return '"metrics-client-ca-file" requires "metrics-cert-dir"'
    if s.metrics_cert_dir and not (s.metrics_client_ca_file or s.metrics_endpoint_auth):
        return (
            '"metrics-cert-dir" enables metrics TLS without authentication; set '
            '"metrics-client-ca-file" or "metrics-endpoint-auth"'
        )
    if s.grpc_client_ca_file and not s.secure_serving:
        return "--grpc-client-ca-file needs --secure-serving"
    files = [f for f in (s.metrics_client_ca_file, s.grpc_client_ca_file) if f]
    if s.metrics_cert_dir:
        files += [os.path.join(s.metrics_cert_dir, n) for n in ("tls.crt", "tls.key")]
    for path in files:
        if not os.path.isfile(path):
            return f"metrics TLS cert file unreadable: {path}"
    return ""
