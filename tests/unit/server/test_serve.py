"""The two gRPC servers (``epp.server.serve``) started on 127.0.0.1: which services each port
answers, TLS from ``--cert-path`` or self-signed, the refusals of bad TLS flags, and where a
group worker's private servers bind."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp._proto import epp_admin_v1_pb2 as pb
from epp.config.loader import ConfigError
from epp.server.admin import AdminServicer, AdminSources
from epp.server.context import ServerContext
from epp.server.health import HealthServicer
from epp.server.serve import GrpcServers, private_host, start_grpc
from tests.certs import CA
from tests.unit.requestcontrol.test_director import EPS, director


@dataclass(frozen=True)
class _S:
    bind_address: str = "127.0.0.1"
    grpc_port: int = 0
    grpc_health_port: int = 0
    grpc_max_recv_msg_size: int = 4 << 20
    grpc_max_send_msg_size: int = 4 << 20
    health_checking: bool = False
    secure_serving: bool = False
    cert_path: str = ""
    enable_cert_reload: bool = False
    tls_min_version: str = ""
    tls_cipher_suites: tuple[str, ...] = ()
    grpc_client_ca_file: str = ""
    group_member: bool = False


Start = Callable[..., Awaitable[GrpcServers]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    started: list[GrpcServers] = []

    async def go(s: _S, admin: bool = False) -> GrpcServers:
        d = director()
        svc = AdminServicer(AdminSources(director=d, endpoints=lambda: EPS, dumpers=()))
        servers = await start_grpc(
            s, ServerContext(d), HealthServicer(lambda: True), svc if admin else None
        )
        started.append(servers)
        return servers

    yield go
    for servers in started:
        await servers.ext.stop(None)
        await servers.health.stop(None)


async def _health(target: str, creds: grpc.ChannelCredentials | None = None) -> int:
    if creds is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        opts = [("grpc.ssl_target_name_override", "localhost")]
        channel = grpc.aio.secure_channel(target, creds, options=opts)
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = await stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=10)
        return int(resp.status)


async def _endpoints(port: int) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/epp.admin.v1.Admin/ListEndpoints",
            request_serializer=pb.ListEndpointsRequest.SerializeToString,
            response_deserializer=pb.ListEndpointsResponse.FromString,
        )
        return await call(pb.ListEndpointsRequest(), timeout=10)


SERVING = health_pb2.HealthCheckResponse.SERVING


async def test_the_health_port_always_answers_and_the_ext_port_only_when_asked(
    start: Start,
) -> None:
    servers = await start(_S())
    assert servers.grpc_port > 0 and servers.health_port > 0
    assert servers.grpc_port != servers.health_port and servers.cert_files is None
    assert await _health(f"127.0.0.1:{servers.health_port}") == SERVING
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _health(f"127.0.0.1:{servers.grpc_port}")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _endpoints(servers.grpc_port)  # no admin API given
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED

    servers = await start(_S(health_checking=True), admin=True)
    assert await _health(f"127.0.0.1:{servers.grpc_port}") == SERVING
    resp = await _endpoints(servers.grpc_port)
    assert [e.address for e in resp.endpoints] == [e.hostport for e in EPS]


async def test_secure_serving_uses_the_cert_path_pair(start: Start, tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")
    servers = await start(_S(health_checking=True, secure_serving=True, cert_path=str(certs)))
    assert servers.cert_files is not None and servers.cert_files.directory == certs
    creds = grpc.ssl_channel_credentials(ca.pem)
    assert await _health(f"127.0.0.1:{servers.grpc_port}", creds) == SERVING
    with pytest.raises(grpc.aio.AioRpcError):  # not plaintext
        await _health(f"127.0.0.1:{servers.grpc_port}")


async def test_secure_serving_without_a_cert_path_is_self_signed(start: Start) -> None:
    servers = await start(_S(health_checking=True, secure_serving=True))
    assert servers.cert_files is None
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a certificate no CA of ours signed
        await _health(f"127.0.0.1:{servers.grpc_port}", grpc.ssl_channel_credentials(CA().pem))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_cert_path_without_a_pair_stops_startup(start: Start, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        await start(_S(secure_serving=True, cert_path=str(tmp_path)))
    assert str(info.value).startswith(f"--cert-path: {tmp_path}: ")
    servers = await start(_S(secure_serving=False, cert_path=str(tmp_path)))  # not used
    assert servers.cert_files is None


async def test_an_unreadable_client_ca_stops_startup(start: Start, tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    with pytest.raises(ConfigError) as info:
        await start(_S(secure_serving=True, grpc_client_ca_file=str(missing)))
    assert str(info.value).startswith("--grpc-client-ca-file: ")
    assert str(missing) in str(info.value)


def _handshake(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def _client(ca: CA, *, version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.pem.decode())
    ctx.set_alpn_protocols(["h2"])
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


async def test_tls_min_version_13_refuses_a_tls_12_handshake(start: Start, tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")
    servers = await start(
        _S(secure_serving=True, cert_path=str(certs), tls_min_version="VersionTLS13")
    )
    loop = asyncio.get_running_loop()
    with pytest.raises(ssl.SSLError):
        await loop.run_in_executor(
            None, _handshake, servers.grpc_port, _client(ca, version=ssl.TLSVersion.TLSv1_2)
        )
    tls13 = await loop.run_in_executor(
        None, _handshake, servers.grpc_port, _client(ca, version=ssl.TLSVersion.TLSv1_3)
    )
    assert tls13.version() == "TLSv1.3" and tls13.selected_alpn_protocol() == "h2"
    tls13.close()
    servers = await start(_S(secure_serving=True, cert_path=str(certs)))  # the default: 1.2 too
    tls12 = await loop.run_in_executor(
        None, _handshake, servers.grpc_port, _client(ca, version=ssl.TLSVersion.TLSv1_2)
    )
    assert tls12.version() == "TLSv1.2"
    tls12.close()


async def test_cipher_suites_restrict_tls_12(start: Start, tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")
    suites = ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",)
    servers = await start(_S(secure_serving=True, cert_path=str(certs), tls_cipher_suites=suites))
    loop = asyncio.get_running_loop()
    client = _client(ca, version=ssl.TLSVersion.TLSv1_2)
    client.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")  # not among the server's
    with pytest.raises(ssl.SSLError):
        await loop.run_in_executor(None, _handshake, servers.grpc_port, client)
    client = _client(ca, version=ssl.TLSVersion.TLSv1_2)
    client.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384")
    tls = await loop.run_in_executor(None, _handshake, servers.grpc_port, client)
    assert tls.cipher()[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"
    tls.close()


async def test_a_client_ca_requires_client_certificates_it_signed(
    start: Start, tmp_path: Path
) -> None:
    ca, clients = CA(), CA()
    certs = ca.leaf().write(tmp_path / "certs")
    (tmp_path / "clients.pem").write_bytes(clients.pem)
    servers = await start(
        _S(
            health_checking=True,
            secure_serving=True,
            cert_path=str(certs),
            grpc_client_ca_file=str(tmp_path / "clients.pem"),
        )
    )
    target = f"127.0.0.1:{servers.grpc_port}"
    with pytest.raises(grpc.aio.AioRpcError):  # no client certificate
        await _health(target, grpc.ssl_channel_credentials(ca.pem))
    stranger = CA().leaf(client=True)  # signed by a CA the server does not trust
    with pytest.raises(grpc.aio.AioRpcError):
        await _health(target, grpc.ssl_channel_credentials(ca.pem, stranger.key, stranger.cert))
    mine = clients.leaf(client=True)
    creds = grpc.ssl_channel_credentials(ca.pem, mine.key, mine.cert)
    assert await _health(target, creds) == SERVING


def test_a_group_worker_binds_its_private_servers_to_loopback() -> None:
    assert private_host(_S(bind_address="0.0.0.0", group_member=True)) == "127.0.0.1"
    assert private_host(_S(bind_address="0.0.0.0")) == "0.0.0.0"


async def test_group_workers_share_the_ext_proc_port_and_nothing_else(start: Start) -> None:
    first = await start(_S(group_member=True))
    second = await start(_S(group_member=True, grpc_port=first.grpc_port))
    assert second.grpc_port == first.grpc_port
    assert await _health(f"127.0.0.1:{second.health_port}") == SERVING
    with pytest.raises(ConfigError, match=r"^--grpc-port: cannot listen"):  # not a group member
        await start(_S(grpc_port=first.grpc_port))
    with pytest.raises(ConfigError, match=r"^--grpc-health-port: cannot listen"):  # its own
        await start(_S(group_member=True, grpc_health_port=first.health_port))


@pytest.mark.parametrize("field", ["grpc_port", "grpc_health_port"])
async def test_a_port_in_use_stops_startup_naming_the_flag(start: Start, field: str) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ConfigError) as info:
            await start(_S(**{field: port}))
    finally:
        taken.close()
    flag = "--" + field.replace("_", "-")
    assert str(info.value).startswith(f"{flag}: cannot listen on 127.0.0.1:{port}")
    assert "in use" in str(info.value)
