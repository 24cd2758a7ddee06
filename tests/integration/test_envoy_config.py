"""``epp envoy-config`` output, as printed by the command, runs a real Envoy in front of a live
EPP: TLS with the EPP's certificate verified (CA + SNI), and the check fails closed with a CA
that did not sign it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epp.server.tls import self_signed
from epp_tools.stack.envoy import Envoy, free_port
from tests.conftest import COMPLETION, post, settle

pytestmark = [pytest.mark.envoy]
EPP = str(Path(sys.executable).parent / "epp")


def _certificate(folder: Path, name: str) -> Path:
    folder.mkdir()
    cert, key = self_signed(name)
    (folder / "tls.crt").write_bytes(cert)
    (folder / "tls.key").write_bytes(key)
    return folder


def _generated(epp_port: int, ca: Path, listen: int, admin: int) -> str:
    args = [EPP, "envoy-config", "--epp-address", f"127.0.0.1:{epp_port}", "--tls", "tls",
            "--ca-file", str(ca), "--sni", "epp", "--listen", f"127.0.0.1:{listen}",
            "--admin", f"127.0.0.1:{admin}"]  # fmt: skip
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout


async def test_generated_tls_config_verifies_the_epp_and_routes(
    start_app, sim_pods, tmp_path: Path
) -> None:
    fleet = await sim_pods(2)
    certs = _certificate(tmp_path / "epp-cert", "epp")
    app = await start_app(fleet.ports, secure_serving=True, cert_path=str(certs))
    await settle(app, lambda m: all(x is not None and x.update_time for x in m.values()))
    listen, admin = free_port(), free_port()
    text = _generated(app.grpc_port, certs / "tls.crt", listen, admin)
    with Envoy("", config_text=text, listen_port=listen, admin_port=admin) as proxy:
        status, headers, body = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200, body
        assert headers["x-sim-pod"] in {"pod-0", "pod-1"}
        assert proxy.stats()["cluster.epp.ssl.handshake"] >= 1


async def test_generated_tls_config_refuses_an_epp_its_ca_did_not_sign(
    start_app, sim_pods, tmp_path: Path
) -> None:
    fleet = await sim_pods(1)
    certs = _certificate(tmp_path / "epp-cert", "epp")
    other = _certificate(tmp_path / "other-ca", "epp")
    app = await start_app(fleet.ports, secure_serving=True, cert_path=str(certs))
    listen, admin = free_port(), free_port()
    text = _generated(app.grpc_port, other / "tls.crt", listen, admin)
    with Envoy("", config_text=text, listen_port=listen, admin_port=admin) as proxy:
        status, _, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status >= 500
        assert proxy.stats().get("cluster.epp.ssl.fail_verify_error", 0) >= 1
