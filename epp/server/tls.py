"""Server credentials: ``--cert-path`` (tls.crt/tls.key) or a self-signed certificate made at
start, as upstream does when ``--secure-serving`` is on without a certificate."""

from __future__ import annotations

import datetime
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


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


def server_credentials(cert_path: str) -> grpc.ServerCredentials:
    if cert_path:
        base = Path(cert_path)
        cert = (base / "tls.crt").read_bytes()
        key = (base / "tls.key").read_bytes()
    else:
        cert, key = self_signed()
    return grpc.ssl_server_credentials([(key, cert)])
