"""What the supervisor settles before any worker starts: that the configuration shares state
between the workers, the ext_proc port they share, and the certificate they present."""

from __future__ import annotations

import socket
from pathlib import Path

from epp.config.loader import ConfigError, parse_config
from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp.server.tls import self_signed
from epp.settings import Settings


def require_syncer(settings: Settings) -> None:
    """Refuse ``--workers N > 1`` unless the config names a cross-replica syncer.

    Each worker learns routing facts from its own share of the traffic: the approximate prefix
    index, session and Responses API bindings, in-flight counts. Unshared, every worker would
    route blind to the others' traffic, and prefix affinity and follow-ups would break in a way
    no metric shows. The syncer (``dataLayer.crossReplicaSyncerPluginRef``) is how EPP replicas
    already share these facts, and the workers of one host are replicas like any other; a second,
    host-local transport would be a second implementation of the same contract to keep in step.
    A local Redis is one process, so the refusal says how to set it up.
    """
    cfg = parse_config(settings.config_text or DEFAULT_CONFIG_TEXT)
    if cfg.data_layer is not None and cfg.data_layer.cross_replica_syncer_plugin_ref:
        return
    which = "the configuration" if settings.config_text else "the built-in default configuration"
    raise ConfigError(
        f"--workers {settings.workers}: the workers must share routing state (prefix index, "
        f"sessions, in-flight load) and {which} names no cross-replica syncer. Run a Redis "
        "server (redis-server --port 6379) and add to the configuration:\n"
        "  plugins:\n"
        "  - type: redis-syncer\n"
        "    parameters: {url: redis://127.0.0.1:6379/0}\n"
        "  dataLayer:\n"
        "    crossReplicaSyncerPluginRef: redis-syncer\n"
        "or run a single process (--workers 1)."
    )


def reserve_port(bind_address: str, port: int) -> socket.socket:
    """A socket bound to the ext_proc port with SO_REUSEPORT, never listening.

    The workers' gRPC servers bind the same port with SO_REUSEPORT (grpcio's default on Linux,
    ``grpc.so_reuseport``=1) and the kernel spreads incoming connections over the listening
    sockets. This one only holds the port: port 0 becomes one concrete port for every worker,
    the port stays the group's while all workers restart, and a port held by a process without
    SO_REUSEPORT is refused here, with the address in the message, before any worker starts.
    """
    family, kind, proto, _, addr = socket.getaddrinfo(
        bind_address or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"--grpc-port: cannot bind {bind_address}:{port}: {exc}") from None
    return sock


def group_certificate(directory: Path) -> str:
    """Write one self-signed certificate for every worker (``--secure-serving`` without
    ``--cert-path``), so a client sees the same certificate whichever worker it reaches."""
    cert, key = self_signed()
    (directory / "tls.crt").write_bytes(cert)
    key_path = directory / "tls.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(key)
    return str(directory)
