"""The admin clients say what to do when the connection does not match the EPP: a TLS client
against a plaintext EPP is told to use ``--plaintext`` (not a bare ``[SSL: WRONG_VERSION_NUMBER]``),
a plaintext client against a TLS EPP to use ``--insecure`` or ``--ca-file``, and a port where
nothing listens is named as such."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from epp.server.tls import self_signed
from epp_tools.stack.envoy import free_port

pytestmark = [pytest.mark.timeout(600)]  # each run is a new Python process: slow when busy
EPP = str(Path(sys.executable).parent / "epp")
DEAD = [1, 2, 3]
BODY = '{"model": "m", "prompt": "hi"}'


async def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [EPP, *args], capture_output=True, text=True, timeout=300
    )


async def test_tls_flags_against_a_plaintext_epp_say_use_plaintext(
    start_app, tmp_path: Path
) -> None:
    app = await start_app(DEAD, secure_serving=False)
    address = f"127.0.0.1:{app.grpc_port}"
    ca = tmp_path / "ca.pem"
    ca.write_bytes(self_signed()[0])
    for flags in (["--insecure"], ["--ca-file", str(ca)]):
        done = await _cli("explain", *flags, "--address", address, "-d", BODY)
        assert done.returncode != 0
        assert f"epp: {address}: this EPP does not serve TLS" in done.stderr, done.stderr
        assert "use --plaintext" in done.stderr
    ok = await _cli("endpoints", "--plaintext", "--address", address)
    assert ok.returncode == 0, ok.stderr


async def test_plaintext_against_a_tls_epp_says_use_insecure_or_a_ca(start_app) -> None:
    app = await start_app(DEAD, secure_serving=True)
    address = f"127.0.0.1:{app.grpc_port}"
    done = await _cli("state", "--plaintext", "--address", address)
    assert done.returncode == 1
    assert "use --insecure or --ca-file" in done.stderr, done.stderr
    ok = await _cli("state", "--insecure", "--address", address)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("flag", ["--insecure", "--plaintext"])
async def test_a_port_where_nothing_listens_is_named(flag: str) -> None:
    address = f"127.0.0.1:{free_port()}"
    done = await _cli("endpoints", flag, "--address", address)
    assert done.returncode != 0
    assert f"epp: {address}: nothing listens there" in done.stderr, done.stderr
