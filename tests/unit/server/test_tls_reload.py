"""Certificate rotation under load, through a real App: a client keeps making requests while
``tls.crt``/``tls.key`` are replaced; new connections get the new certificate without a restart
and no request fails. Also metrics mTLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.tls import CertFiles
from tests.certs import CA, Leaf, serial_of
from tests.conftest import wait_for

TOKEN = "tok"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_context(
    ca: CA, alpn: str = "", client: Leaf | None = None, tmp: Path | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.pem.decode())
    if alpn:
        ctx.set_alpn_protocols([alpn])
    if client is not None and tmp is not None:
        client.write(tmp)
        ctx.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    return ctx


async def served_serial(port: int, ctx: ssl.SSLContext) -> int:
    """The serial of the certificate a new TLS connection to ``port`` is shown."""
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="localhost")
    der = w.get_extra_info("ssl_object").getpeercert(binary_form=True)
    w.transport.abort()
    return serial_of(der)


async def until_served(port: int, ctx: ssl.SSLContext, serial: int) -> None:
    async with asyncio.timeout(10):
        while await served_serial(port, ctx) != serial:
            await asyncio.sleep(0.05)


class Load:
    """Requests made back to back until stopped; counts successes, keeps failures."""

    def __init__(self) -> None:
        self.ok = 0
        self.failures: list[BaseException] = []
        self.stop = asyncio.Event()

    async def wait_more(self, n: int) -> None:
        target = self.ok + n
        await wait_for(lambda: self.ok >= target or bool(self.failures), timeout=20)


async def test_grpc_certificate_rotates_under_load(start_app: Any, tmp_path: Path) -> None:
    ca = CA()
    first = ca.leaf()
    certs = first.write(tmp_path / "grpc")
    app = await start_app(
        [closed_port()],
        ready=False,
        secure_serving=True,
        cert_path=str(certs),
        enable_cert_reload=True,
        health_checking=True,
    )
    load = Load()
    creds = grpc.ssl_channel_credentials(root_certificates=ca.pem)

    async def client(fresh_channels: bool) -> None:
        while not load.stop.is_set():
            async with grpc.aio.secure_channel(f"localhost:{app.grpc_port}", creds) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                for _ in range(1 if fresh_channels else 10**9):
                    if load.stop.is_set():
                        return
                    try:
                        await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                        load.ok += 1
                    except grpc.RpcError as exc:
                        load.failures.append(exc)

    tasks = [asyncio.create_task(client(False)), asyncio.create_task(client(True))]
    try:
        await load.wait_more(20)
        ctx = client_context(ca, "h2")
        assert await served_serial(app.grpc_port, ctx) == first.serial
        second = ca.leaf()
        second.write(certs)
        await until_served(app.grpc_port, ctx, second.serial)
        await load.wait_more(20)  # both the old connection and new ones keep working
    finally:
        load.stop.set()
        await asyncio.gather(*tasks)
    assert load.failures == []
    assert load.ok >= 40


async def test_metrics_mtls_certificate_rotates_under_load(start_app: Any, tmp_path: Path) -> None:
    ca = CA()
    first = ca.leaf()
    certs = first.write(tmp_path / "metrics")
    (tmp_path / "ca.crt").write_bytes(ca.pem)
    app = await start_app(
        [closed_port()],
        ready=False,
        metrics_cert_dir=str(certs),
        metrics_client_ca_file=str(tmp_path / "ca.crt"),
        enable_cert_reload=True,
        metrics_token=TOKEN,
    )
    port = app.metrics_port
    ctx = client_context(ca, client=ca.leaf("scraper", client=True), tmp=tmp_path / "client")
    url = f"https://localhost:{port}/metrics"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    load = Load()

    async def scrape() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            while not load.stop.is_set():
                try:
                    async with s.get(url, headers=auth) as r:
                        assert r.status == 200, r.status
                        await r.read()
                        load.ok += 1
                except Exception as exc:
                    load.failures.append(exc)

    task = asyncio.create_task(scrape())
    try:
        await load.wait_more(10)
        assert await served_serial(port, ctx) == first.serial
        second = ca.leaf()
        second.write(certs)
        await until_served(port, ctx, second.serial)
        await load.wait_more(10)
    finally:
        load.stop.set()
        await task
    assert load.failures == []
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s,
        s.get(url) as r,
    ):
        assert r.status == 401  # mTLS does not replace the token
    no_client_cert = aiohttp.TCPConnector(ssl=client_context(ca))
    async with aiohttp.ClientSession(connector=no_client_cert) as s:
        with pytest.raises(aiohttp.ClientError):
            async with s.get(url, headers=auth) as r:
                await r.read()


def test_a_half_written_rotation_keeps_the_old_pair(tmp_path: Path) -> None:
    ca = CA()
    first, second = ca.leaf(), ca.leaf()
    files = CertFiles(str(first.write(tmp_path)))
    seen: list[bytes] = []
    files.on_change(lambda key, cert: seen.append(cert))
    (tmp_path / "tls.crt").write_bytes(second.cert)  # the key is still the old one
    assert files.check() is False and files.cert == first.cert
    (tmp_path / "tls.key").write_bytes(second.key)
    assert files.check() is True and files.cert == second.cert and seen == [second.cert]
    assert files.check() is False and files.generation == 1
    (tmp_path / "tls.key").unlink()
    with pytest.raises(ValueError, match=r"tls\.key"):
        CertFiles(str(tmp_path))
