"""The two gRPC servers an EPP listens on: ext_proc (plus gRPC health when enabled) on
``--grpc-port``, and the standalone health server on ``--grpc-health-port``.

The ext_proc port is served by grpc.aio (``--ext-proc-server grpc``, the default) or by
``epp.server.h2`` (``--ext-proc-server h2``); the health port always by grpc.aio.

A worker of an ``epp --workers N`` group shares the ext_proc port with its siblings through
``SO_REUSEPORT`` (the kernel spreads connections across them); its health server stays private
on 127.0.0.1 so the supervisor can ask each worker separately, and never takes the reuse flag so
two workers can never answer for each other.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2_grpc

from epp.config.loader import ConfigError
from epp.server.admin import AdminServicer
from epp.server.context import ServerContext
from epp.server.extproc import ExtProcServicer, add_to_server
from epp.server.h2 import H2Server, tls_context
from epp.server.health import HealthServicer
from epp.server.tls import CertFiles, grpc_credentials
from epp.server.tlsopts import check_grpc_ciphers

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
    def tls_cipher_suites(self) -> tuple[str, ...]: ...

    @property
    def grpc_client_ca_file(self) -> str: ...

    @property
    def group_member(self) -> bool: ...

    @property
    def ext_proc_server(self) -> str: ...


@dataclass
class GrpcServers:
    ext: grpc.aio.Server | H2Server
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
    if s.ext_proc_server == "h2":
        if admin is not None:
            log.warning("--ext-proc-server=h2: the admin gRPC API is not served (use grpc)")
        ext: grpc.aio.Server | H2Server = H2Server(
            context, health if s.health_checking else None, max_message=s.grpc_max_recv_msg_size
        )
        tls = tls_context(s.cert_path) if s.secure_serving else None
        try:
            grpc_port = await ext.start(
                s.bind_address, s.grpc_port, tls=tls, reuse_port=s.group_member
            )
        except OSError as exc:
            raise ConfigError(
                f"--grpc-port: cannot listen on {s.bind_address}:{s.grpc_port}: {exc.strerror}"
            ) from None
    else:
        ext, grpc_port = await _grpc_aio(s, context, health, admin, files)
    hs = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, hs)
    try:
        health_port = listen(hs, f"{private_host(s)}:{s.grpc_health_port}", "--grpc-health-port")
    except ConfigError:
        await ext.stop(None)  # already serving: stopped here, not by a finaliser after the loop
        raise
    await hs.start()
    return GrpcServers(ext, hs, grpc_port, health_port, files)


async def _grpc_aio(
    s: ServeSettings,
    context: ServerContext,
    health: HealthServicer,
    admin: AdminServicer | None,
    files: CertFiles | None,
) -> tuple[grpc.aio.Server, int]:
    opts = [
        ("grpc.max_receive_message_length", s.grpc_max_recv_msg_size),
        ("grpc.max_send_message_length", s.grpc_max_send_msg_size),
        ("grpc.so_reuseport", 1 if s.group_member else 0),
    ]
    ext = grpc.aio.server(options=opts)
    add_to_server(ExtProcServicer(context), ext)
    if s.health_checking:
        health_pb2_grpc.add_HealthServicer_to_server(health, ext)
    if admin is not None:
        ext.add_generic_rpc_handlers((admin.handler(),))
    addr = f"{s.bind_address}:{s.grpc_port}"
    try:
        client_ca = Path(s.grpc_client_ca_file).read_bytes() if s.grpc_client_ca_file else None
    except OSError as exc:
        raise ConfigError(f"--grpc-client-ca-file: {exc}") from None
    try:
        check_grpc_ciphers(s.tls_cipher_suites if s.secure_serving else ())
    except RuntimeError as exc:
        raise ConfigError(str(exc)) from None
    if s.secure_serving:
        creds = grpc_credentials(files, reload=s.enable_cert_reload, client_ca=client_ca)
        grpc_port = listen(ext, addr, "--grpc-port", creds)
    else:
        grpc_port = listen(ext, addr, "--grpc-port")
    await ext.start()
    return ext, grpc_port


def listen(
    server: grpc.aio.Server,
    addr: str,
    flag: str,
    creds: grpc.ServerCredentials | None = None,
) -> int:
    """Binds ``addr``; a port that cannot be bound (taken, or no such address) is a start-up
    error naming the flag, not gRPC's traceback."""
    try:
        if creds is None:
            return int(server.add_insecure_port(addr))
        return int(server.add_secure_port(addr, creds))
    except RuntimeError:
        raise ConfigError(
            f"{flag}: cannot listen on {addr} (address in use or unavailable)"
        ) from None


def private_host(s: ServeSettings) -> str:
    """Where the per-process servers (health, metrics) bind: loopback for a group worker."""
    return "127.0.0.1" if s.group_member else s.bind_address
