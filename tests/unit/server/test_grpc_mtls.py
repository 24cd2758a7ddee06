"""``--grpc-client-ca-file``: the ext_proc port requires a client certificate signed by the CA,
with and without certificate reload."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.certs import CA


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def check(port: int, creds: grpc.ChannelCredentials) -> None:
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as ch:
        await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)


@pytest.mark.parametrize("reload", [False, True])
async def test_ext_proc_requires_a_client_certificate(
    start_app: Any, tmp_path: Path, reload: bool
) -> None:
    ca, other = CA(), CA("other-ca")
    certs = ca.leaf().write(tmp_path / "certs")
    (tmp_path / "clients.crt").write_bytes(ca.pem)
    app = await start_app(
        [closed_port()],
        ready=False,
        secure_serving=True,
        cert_path=str(certs),
        enable_cert_reload=reload,
        grpc_client_ca_file=str(tmp_path / "clients.crt"),
        health_checking=True,
    )
    good, stranger = ca.leaf("envoy", client=True), other.leaf("envoy", client=True)
    await check(app.grpc_port, grpc.ssl_channel_credentials(ca.pem, good.key, good.cert))
    for creds in (
        grpc.ssl_channel_credentials(ca.pem),
        grpc.ssl_channel_credentials(ca.pem, stranger.key, stranger.cert),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await check(app.grpc_port, creds)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
