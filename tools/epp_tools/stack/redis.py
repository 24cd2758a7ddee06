"""A local ``redis-server`` process for the tools and the tests: the shared store of active-active
EPP replicas (``redis-syncer``) on this machine.

It listens on 127.0.0.1 only, without persistence (``--save "" --appendonly no``), in a
directory of its own. ``kill`` (SIGKILL) then ``start`` brings it back empty on the same port, as a
Redis that crashed and restarted without persistence would. ``available()`` says whether the
binary is installed (Debian: ``apt-get install redis-server``).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epp_tools.stack.envoy import free_port

INSTALL_HINT = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"


def available() -> bool:
    return shutil.which("redis-server") is not None


@dataclass
class RedisServer:
    """A ``redis-server`` on 127.0.0.1 without persistence, in its own directory. ``kill`` then
    ``start`` brings it back empty on the same port. ``tls`` = (CA, cert, key) PEM paths serves
    TLS only (clients must present a certificate signed by the CA)."""

    workdir: Path
    args: tuple[str, ...] = ()
    tls: tuple[Path, Path, Path] | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.port = self.port or free_port()
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            ca, cert, key = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-ca-cert-file", str(ca)]
            listen += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        cmd = ["redis-server", *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.workdir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(
                [*cmd, "--dir", str(self.workdir), *self.args], stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server not listening: {self.log()}")
            time.sleep(0.02)

    def client(self, **kw: Any) -> Any:
        """A synchronous redis-py client (``kw``: credentials)."""
        import redis

        if self.tls is not None:
            ca, cert, key = self.tls
            kw |= {"ssl_ca_certs": str(ca), "ssl_certfile": str(cert), "ssl_keyfile": str(key)}
            kw |= {"ssl_check_hostname": False}
        return redis.Redis.from_url(self.url, socket_timeout=5, **kw)

    def kill(self) -> None:
        """SIGKILL: connections drop at once, the data is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        path = self.workdir / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
