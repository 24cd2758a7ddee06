"""What the supervisor settles before starting workers: the syncer, the shared port, the
certificate; and the grpcio behaviour the shared port relies on."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from epp.config.loader import ConfigError
from epp.settings import Settings
from epp.workers.preflight import group_certificate, require_syncer, reserve_port

BASE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
"""


def test_workers_without_a_syncer_are_refused_with_how_to_configure_redis() -> None:
    with pytest.raises(ConfigError) as info:
        require_syncer(Settings(workers=2, config_text=BASE))
    message = str(info.value)
    assert message.startswith("--workers 2: the workers must share routing state")
    assert "type: redis-syncer" in message
    assert "crossReplicaSyncerPluginRef: redis-syncer" in message
    assert "--workers 1" in message


def test_the_builtin_default_config_names_no_syncer_and_is_refused() -> None:
    with pytest.raises(ConfigError, match="the built-in default configuration names no"):
        require_syncer(Settings(workers=3))


def test_a_config_naming_a_syncer_is_accepted() -> None:
    text = BASE + "dataLayer:\n  crossReplicaSyncerPluginRef: shared\n"
    require_syncer(Settings(workers=2, config_text=text))


def test_a_config_that_does_not_parse_is_refused_before_any_worker() -> None:
    with pytest.raises(ConfigError, match="apiVersion"):
        require_syncer(Settings(workers=2, config_text="apiVersion: x\nkind: y\n"))


def test_grpcio_binds_with_so_reuseport_by_default_and_not_when_told() -> None:
    """The canary for what --workers relies on: two grpc servers, default options, one port."""
    with reserve_port("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        first, second = grpc.server(None), grpc.server(None)  # type: ignore[arg-type]
        assert first.add_insecure_port(f"127.0.0.1:{port}") == port
        assert second.add_insecure_port(f"127.0.0.1:{port}") == port
        refusing = grpc.server(None, options=[("grpc.so_reuseport", 0)])  # type: ignore[arg-type]
        with pytest.raises(RuntimeError):
            refusing.add_insecure_port(f"127.0.0.1:{port}")


def test_reserve_port_resolves_port_zero_and_never_listens() -> None:
    with reserve_port("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        assert port > 0
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_a_port_held_without_so_reuseport_is_refused_with_the_address() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--grpc-port: cannot bind 127.0.0.1:{port}"):
            reserve_port("127.0.0.1", port)


def test_the_group_certificate_is_written_once_with_a_private_key(tmp_path: Path) -> None:
    where = Path(group_certificate(tmp_path))
    x509.load_pem_x509_certificate((where / "tls.crt").read_bytes())
    assert stat.S_IMODE((where / "tls.key").stat().st_mode) == 0o600
    assert b"PRIVATE KEY" in (where / "tls.key").read_bytes()
