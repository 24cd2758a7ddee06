"""EPP replicas behind one Envoy, as the benchmark runs them: one process (target ``epp``),
``n`` active-active replicas that learn alone (``epp-r<n>``) or share what they learn through a
local ``redis-server`` (``epp-r<n>-redis``), or one ``epp --workers k`` group.

Each replica is its own ``python -m epp`` process with its own ports and seed (``--seed`` 1, 2,
...), so ties break differently per replica as in a real deployment. With more than one replica
the replicas serve ``grpc.health.v1`` on their ext_proc port (``--health-checking``) and Envoy
balances ext_proc streams round-robin over the ones its health check finds SERVING (a replica
replaying the shared log is not SERVING yet; ``epp_tools.stack.envoy``). A shared set adds the
``redis-syncer`` to every replica's config (``epp_tools.stack.eppconfig.with_syncer``).

A replica can be stopped (SIGTERM, or SIGKILL) and started again on the same ports, and the Redis
killed and restarted empty on its port: what ``epp bench replicas`` does under load.
"""

from __future__ import annotations

import contextlib
import sys
import time
import urllib.error
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp_tools.stack.envoy import Envoy, free_port
from epp_tools.stack.eppconfig import with_syncer
from epp_tools.stack.procs import START_TIMEOUT, Proc, direct_opener, wait_http
from epp_tools.stack.redis import INSTALL_HINT, RedisServer, available


class SetupError(Exception):
    """The replica set cannot run here (e.g. no ``redis-server`` for a shared set)."""


@dataclass(frozen=True)
class _Ports:
    grpc: int
    health: int
    metrics: int


@dataclass
class EppSet:
    workdir: Path
    config_text: str
    replicas: int = 1
    shared: bool = False
    workers: int = 1
    """``--workers`` of each replica (above 1 needs ``shared``: the workers share through Redis)."""
    extra_args: Sequence[str] = ()
    envoy_max_streams: int = 0
    envoy_config: str = "full-duplex"
    """The ``deploy/envoy`` config Envoy runs (``buffered-failopen`` fails open to ``fallback``)."""
    fallback: Sequence[tuple[str, int]] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of the EPP processes (e.g. ``PYTHONPATH`` of another checkout)."""
    initial: int = 0
    """Replicas ``start()`` starts (0: all); the other slots have ports Envoy health-checks and
    are started later with ``start_replica`` (a rolling update's new pods)."""
    slot_args: Mapping[int, Sequence[str]] = field(default_factory=dict)
    """Further arguments of one slot's process (after ``extra_args``: a later flag wins)."""
    envoy_pool: Sequence[tuple[str, int]] = ()
    """The model servers' addresses Envoy knows (``epp envoy-config --pool-endpoint``): retries
    go to another pod and failing pods are ejected; empty: ORIGINAL_DST."""
    redis: RedisServer | None = None
    envoy: Envoy | None = None
    procs: list[Proc] = field(default_factory=list)
    ports: list[_Ports] = field(default_factory=list)
    _config: Path | None = None

    @property
    def url(self) -> str:
        return self.envoy.url if self.envoy is not None else ""

    def metrics_url(self, i: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[i].metrics}/metrics"

    def start(self, timeout: float = START_TIMEOUT) -> EppSet:
        if (self.shared or self.workers > 1) and not available():
            raise SetupError(INSTALL_HINT)
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = self.config_text
        if self.shared or self.workers > 1:
            redis_dir = self.workdir / "redis"
            redis_dir.mkdir(exist_ok=True)
            self.redis = RedisServer(redis_dir).start()
            text = with_syncer(text, self.redis.url)
        self._config = self.workdir / "epp-config.yaml"
        self._config.write_text(text)
        self.ports = [_Ports(free_port(), free_port(), free_port()) for _ in range(self.replicas)]
        self.procs = [self._proc(i) for i in range(self.replicas)]
        try:
            for i in range(self.initial or self.replicas):
                self.start_replica(i, timeout)
            self.envoy = Envoy(
                self.envoy_config,
                epp_port=self.ports[0].grpc,
                fallback=self.fallback,
                epp_tls=False,
                epp_replicas=[p.grpc for p in self.ports[1:]],
                epp_max_streams=self.envoy_max_streams,
                pool=self.envoy_pool,
            ).start()
            if self.replicas > 1 and not self.initial:
                self.wait_healthy(self.replicas, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _proc(self, i: int) -> Proc:
        assert self._config is not None
        p = self.ports[i]
        argv = [
            sys.executable, "-m", "epp", "--config-file", str(self._config),
            "--secure-serving=false", "--grpc-port", str(p.grpc),
            "--grpc-health-port", str(p.health), "--metrics-port", str(p.metrics),
            "--bind-address", "127.0.0.1", "--drain-timeout", "0s", "--seed", str(i + 1),
            *self.extra_args, *self.slot_args.get(i, ()),
        ]  # fmt: skip
        if self.replicas > 1:
            argv.append("--health-checking")
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        return Proc(f"epp-{i}", argv, self.workdir / f"epp-{i}.log", env=self.env)

    def start_replica(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Start replica ``i`` (again) on its ports and wait until it serves metrics."""
        self.procs[i] = self._proc(i)
        self.procs[i].log_path = self.workdir / f"epp-{i}.{int(time.time() * 1000)}.log"
        self.procs[i].start()
        wait_http(self.metrics_url(i), self.procs[i], timeout=timeout)

    def stop_replica(self, i: int, *, kill: bool = False) -> None:
        proc = self.procs[i]
        if kill and proc.popen is not None and proc.alive():
            proc.popen.kill()
            proc.popen.wait(timeout=10)
        proc.stop()

    def healthy(self) -> int:
        """EPP replicas Envoy's health check finds SERVING now."""
        if self.envoy is None:
            return 0
        with contextlib.suppress(OSError, urllib.error.URLError):
            return self.envoy.stats().get("cluster.epp.membership_healthy", 0)
        return 0

    def wait_healthy(self, n: int, timeout: float = START_TIMEOUT) -> float:
        """Wait until ``n`` replicas are healthy in Envoy; returns when that happened."""
        deadline = time.monotonic() + timeout
        while self.healthy() < n:
            if time.monotonic() > deadline:
                logs = "\n".join(p.log_tail(800) for p in self.procs)
                raise TimeoutError(
                    f"fewer than {n} EPP replicas healthy after {timeout:g}s\n{logs}"
                )
            time.sleep(0.05)
        return time.monotonic()

    def pids(self) -> dict[str, int]:
        out = {"epp" if self.replicas == 1 else f"epp-{i}": p.pid for i, p in enumerate(self.procs)}
        if self.envoy is not None and self.envoy.proc is not None:
            out["envoy"] = self.envoy.proc.pid
        if self.redis is not None and self.redis.proc is not None:
            out["redis"] = self.redis.proc.pid
        return out

    def scrape(self, i: int) -> str:
        """Replica ``i``'s ``/metrics`` text ("" when it does not answer)."""
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            direct_opener().open(self.metrics_url(i), timeout=5) as r,
        ):
            return str(r.read().decode())
        return ""

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.stop()
        for proc in self.procs:
            proc.stop()
        if self.redis is not None:
            self.redis.stop()
