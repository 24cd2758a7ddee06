"""Connecting to an EPP's admin API: plaintext, TLS verified against a CA, or TLS trusting
whatever certificate the EPP presents (``--insecure``: its self-signed default), with the bearer
token of ``--token-file`` on every call."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from epp._proto import epp_admin_v1_pb2 as pb

SERVICE = "/epp.admin.v1.Admin/"
METHODS: dict[str, tuple[Any, Any]] = {
    "Explain": (pb.ExplainRequest, pb.ExplainResponse),
    "ListEndpoints": (pb.ListEndpointsRequest, pb.ListEndpointsResponse),
    "DumpState": (pb.DumpStateRequest, pb.DumpStateResponse),
}


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="127.0.0.1:9002", metavar="HOST:PORT",
                   help="the EPP's gRPC (ext_proc) address (default 127.0.0.1:9002)")  # fmt: skip
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--plaintext", action="store_true", help="the EPP serves without TLS")
    tls.add_argument("--ca-file", default="", help="CA bundle that verifies the EPP's certificate")
    tls.add_argument("--insecure", action="store_true",
                     help="TLS, not verifying the EPP's (self-signed) certificate")  # fmt: skip
    p.add_argument("--server-name", default="", help="name to verify the certificate against")
    p.add_argument("--token-file", default="", help="file holding the admin bearer token")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")


def _name_in(pem: bytes) -> str:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = san.get_values_for_type(x509.DNSName)
        if names:
            return str(names[0])
    except x509.ExtensionNotFound:
        pass
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else ""


def open_channel(args: argparse.Namespace) -> grpc.aio.Channel:
    if args.plaintext:
        return grpc.aio.insecure_channel(args.address)
    options: list[tuple[str, Any]] = []
    if args.ca_file:
        root = Path(args.ca_file).read_bytes()
        name = args.server_name
    elif args.insecure:
        host, _, port = args.address.rpartition(":")
        root = ssl.get_server_certificate(
            (host.strip("[]"), int(port)), timeout=args.timeout
        ).encode()
        name = args.server_name or _name_in(root)
    else:
        raise ValueError("the EPP serves TLS by default: pass --ca-file, --insecure or --plaintext")
    if name:
        options.append(("grpc.ssl_target_name_override", name))
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    return grpc.aio.secure_channel(args.address, creds, options=options)


NOT_TLS = "this EPP does not serve TLS (it runs with --secure-serving=false): use --plaintext"
MAYBE_TLS = (
    "if this EPP serves TLS (its default), use --insecure or --ca-file instead of --plaintext"
)


def connection_hint(args: argparse.Namespace, error: str) -> str:
    """What to do about a failed connection, from the error's text; ``""`` when nothing is known.
    A TLS client reaching a plaintext port fails its handshake with ``WRONG_VERSION_NUMBER`` (the
    server's first bytes are not a TLS record); a plaintext client reaching a TLS port sees the
    connection closed."""
    if "WRONG_VERSION_NUMBER" in error.upper().replace(" ", "_"):
        return NOT_TLS
    if args.plaintext and "socket closed" in error.lower():
        return MAYBE_TLS
    if "connection refused" in error.lower():
        return "nothing listens there: is the EPP running, and is this its --grpc-port?"
    return ""


async def call(args: argparse.Namespace, method: str, request: Any) -> Any:
    """One admin call; grpc.aio.AioRpcError when the EPP refuses or is unreachable."""
    request_type, response_type = METHODS[method]
    metadata = []
    if args.token_file:
        metadata.append(("authorization", f"Bearer {Path(args.token_file).read_text().strip()}"))
    async with open_channel(args) as channel:
        stub = channel.unary_unary(
            SERVICE + method,
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        return await stub(request, timeout=args.timeout, metadata=metadata)
