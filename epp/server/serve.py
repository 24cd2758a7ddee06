"""The two gRPC servers an EPP listens on: ext_proc (plus the admin API, and gRPC health when
enabled) on ``--grpc-port``, served by ``epp.server.h2``; and the standalone health server on
``--grpc-health-port``, served by grpc.aio (a few checks a second: its per-message cost does
not matter there).

A worker of an ``epp --workers N`` group shares the ext_proc port with its siblings through
``SO_REUSEPORT`` (the kernel spreads connections across them); its health server stays private
on 127.0.0.1 so the supervisor can ask each worker separately, and never takes the reuse flag so
two workers can never answer for each other.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2_grpc

from epp.config.loader import ConfigError
from epp.server.admin import AdminServicer
from epp.server.context import ServerContext
from epp.server.h2 import H2Server
from epp.server.health import HealthServicer
from epp.server.tls import CertFiles, server_ssl_context

log = logging.getLogger(__name__)


class ServeSettings(Protocol):
    """The settings the servers read (``epp.settings.Settings`` has them all)."""

    @property
    def bind_address(self) -> str: ...

    @property
    def grpc_port(self) -> int: ...

    @property
    def grpc_health_port(self) -> int: ...

    @property
    def grpc_max_recv_msg_size(self) -> int: ...

    @property
    def grpc_max_send_msg_size(self) -> int: ...

    @property
    def health_checking(self) -> bool: ...

    @property
    def secure_serving(self) -> bool: ...

    @property
    def cert_path(self) -> str: ...

    @property
    def enable_cert_reload(self) -> bool: ...

    @property
    def tls_min_version(self) -> str: ...

    @property
    def tls_cipher_suites(self) -> tuple[str, ...]: ...

    @property
    def grpc_client_ca_file(self) -> str: ...

    @property
    def group_member(self) -> bool: ...


@dataclass
class GrpcServers:
    ext: H2Server
    health: grpc.aio.Server
    grpc_port: int
    health_port: int
    cert_files: CertFiles | None = None
    """``--cert-path``'s files; the caller watches them with ``--enable-cert-reload``."""


async def start_grpc(
    s: ServeSettings,
    context: ServerContext,
    health: HealthServicer,
    admin: AdminServicer | None = None,
) -> GrpcServers:
    """Bind and start both servers; the returned ports are the ones actually bound (``0`` in the
    settings means "pick a free one"). ``admin``: the admin API, on the ext_proc port."""
    try:
        files = CertFiles(s.cert_path) if s.secure_serving and s.cert_path else None
    except ValueError as exc:
        raise ConfigError(f"--cert-path: {exc}") from None
    tls = _tls(s, files) if s.secure_serving else None
    ext = H2Server(
        context,
        health if s.health_checking else None,
        max_message=s.grpc_max_recv_msg_size,
        max_send=s.grpc_max_send_msg_size,
        admin=admin,
    )
    try:
        grpc_port = await ext.start(s.bind_address, s.grpc_port, tls=tls, reuse_port=s.group_member)
    except OSError as exc:
        raise ConfigError(
            f"--grpc-port: cannot listen on {s.bind_address}:{s.grpc_port}: {exc.strerror}"
        ) from None
    hs = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, hs)
    try:
        health_port = listen(hs, f"{private_host(s)}:{s.grpc_health_port}", "--grpc-health-port")
    except ConfigError:
        await ext.stop(None)  # already serving: stopped here, not by a finaliser after the loop
        raise
    await hs.start()
    return GrpcServers(ext, hs, grpc_port, health_port, files)


def _tls(s: ServeSettings, files: CertFiles | None) -> ssl.SSLContext:
    if s.grpc_client_ca_file:
        try:
            ssl.create_default_context(cafile=s.grpc_client_ca_file)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"--grpc-client-ca-file: {s.grpc_client_ca_file}: {exc}") from None
    try:
        return server_ssl_context(
            files,
            client_ca_file=s.grpc_client_ca_file,
            min_version=s.tls_min_version,
            cipher_suites=s.tls_cipher_suites,
            alpn=("h2",),
        )
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise ConfigError(f"--tls-*: {exc}") from None


def listen(server: grpc.aio.Server, addr: str, flag: str) -> int:
    """Binds ``addr``; a port that cannot be bound (taken, or no such address) is a start-up
    error naming the flag, not gRPC's traceback."""
    try:
        return int(server.add_insecure_port(addr))
    except RuntimeError:
        raise ConfigError(
            f"{flag}: cannot listen on {addr} (address in use or unavailable)"
        ) from None


def private_host(s: ServeSettings) -> str:
    """Where the per-process servers (health, metrics) bind: loopback for a group worker."""
    return "127.0.0.1" if s.group_member else s.bind_address
