"""The ``epp`` process with ``--tls-cipher-suites`` and ``--tls-min-version``: the ext_proc
port negotiates only the suites listed for TLS 1.2, and TLS 1.3 as always."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import sys
from pathlib import Path

from epp_tools.stack.envoy import free_port
from tests.certs import CA
from tests.conftest import endpoints_yaml, epp_config

EPP = str(Path(sys.executable).parent / "epp")


def context(ca: CA, version: ssl.TLSVersion, cipher: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=ca.pem.decode())
    ctx.set_alpn_protocols(["h2"])
    ctx.minimum_version = ctx.maximum_version = version
    if cipher:
        ctx.set_ciphers(cipher)
    return ctx


async def negotiated(port: int, ctx: ssl.SSLContext) -> str:
    """The cipher of a new connection, or the handshake error's name."""
    try:
        _, w = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="localhost"
        )
    except OSError as exc:  # refused (not listening yet), reset or a failed handshake
        return type(exc).__name__
    cipher = w.get_extra_info("ssl_object").cipher()[0]
    w.transport.abort()
    return str(cipher)


async def test_cipher_suites_and_min_version_reach_the_grpc_server(tmp_path: Path) -> None:
    ca = CA()
    certs = ca.leaf().write(tmp_path / "certs")  # an ECDSA key
    eps = tmp_path / "eps.yaml"
    eps.write_text(endpoints_yaml([1]))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(epp_config(eps))
    port = free_port()
    argv = [EPP, "--config-file", str(cfg), "--grpc-port", str(port), "--bind-address",
            "127.0.0.1", "--grpc-health-port", str(free_port()), "--metrics-port",
            str(free_port()), "--cert-path", str(certs), "--tls-min-version=VersionTLS12",
            "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
            "--drain-timeout=0s"]  # fmt: skip
    log = tmp_path / "epp.log"  # a file, not a pipe nobody reads while the test waits
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stderr=err)
    allowed = context(ca, ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-GCM-SHA384")
    try:
        # a process start on a busy machine can take tens of seconds: bounded by the process
        # exiting and, generously, by time
        async with asyncio.timeout(100):
            while (got := await negotiated(port, allowed)) != "ECDHE-ECDSA-AES256-GCM-SHA384":
                assert proc.poll() is None, log.read_text()
                await asyncio.sleep(0.1)
        other = context(ca, ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-GCM-SHA256")
        assert await negotiated(port, other) in ("SSLError", "ConnectionResetError")
        assert (await negotiated(port, context(ca, ssl.TLSVersion.TLSv1_3))).startswith("TLS_")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert got
