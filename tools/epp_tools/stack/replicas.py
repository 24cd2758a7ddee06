"""EPP processes behind one Envoy, the one launcher of ``epp stack`` and the benchmarks: one EPP,
``n`` active-active replicas that learn alone or share what they learn through a local
``redis-server``, or one ``epp --workers k`` group.

Each EPP is its own ``python -m epp`` process on 127.0.0.1 with free ports (ext_proc, health,
metrics), its own log file in the work directory, and its own ``--seed`` (1, 2, ...: ties break
differently per replica, as in a deployment; ``seeds=False`` leaves the seed out, as ``epp
stack`` does for a single EPP). ``tls`` serves ext_proc with TLS, as the EPP does by default
(``epp stack``), and Envoy then speaks TLS to it; without it the EPPs run
``--secure-serving=false`` (the benchmarks). With more than one replica:

- the replicas serve ``grpc.health.v1`` on their ext_proc port (``--health-checking``) and Envoy
  balances ext_proc streams round-robin over the ones its health check finds SERVING (a replica
  replaying the shared log is not SERVING yet; ``epp_tools.stack.envoy``);
- a shared set (``shared``, and every ``--workers`` group) starts a ``redis-server`` on a free
  127.0.0.1 port, without persistence, in a directory of the run (``epp_tools.stack.redis``),
  and every replica's config is the given one plus a ``redis-syncer`` on it and
  ``dataLayer.crossReplicaSyncerPluginRef`` / ``crossReplicaSyncInterval: 200ms``
  (``epp_tools.stack.eppconfig.with_syncer``).

``start`` starts the EPPs one after the other, each once it serves ``/metrics``, then Envoy in
front of them, and waits until Envoy finds every replica healthy; ``launch`` only starts the
processes (``epp stack`` waits for them asynchronously, its simulated pods sharing its event
loop) and ``start_envoy`` adds Envoy afterwards. A replica can be stopped (SIGTERM, or SIGKILL)
and started again on the same ports, and the Redis killed and restarted empty on its port: what
``epp bench replicas`` does under load; ``initial`` starts only the first replicas, the others'
ports being health-checked by Envoy already (a rolling update's new pods).

``report`` tells what each replica did: the ext_proc streams Envoy sent it (its ``/clusters``
``rq_total``), the requests it handled (``llm_d_epp_request_total``) and its cross-replica sync
(``llm_d_epp_state_sync_*``: facts published and applied, errors, lag, whether it replayed the
log at start). ``stop`` stops Envoy, the EPPs, then Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
import urllib.error
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp_tools.stack.envoy import Envoy, free_ports
from epp_tools.stack.eppconfig import with_syncer
from epp_tools.stack.procs import START_TIMEOUT, Proc, direct_opener, wait_http
from epp_tools.stack.redis import INSTALL_HINT, RedisServer, available

SYNC_INTERVAL: Final = "200ms"
REQUESTS: Final = "llm_d_epp_request_total"
SYNC: Final = "llm_d_epp_state_sync_"


class SetupError(Exception):
    """The EPPs cannot run here (e.g. no ``redis-server`` for a shared set)."""


def check_replicas(replicas: int) -> None:
    """Raise ``SetupError`` when ``epp stack --replicas`` cannot run on this machine."""
    if replicas > 1 and not available():
        raise SetupError(f"--replicas {replicas} needs a shared Redis, but {INSTALL_HINT}")


@dataclass(frozen=True)
class Ports:
    """One EPP's ports on 127.0.0.1."""

    grpc: int
    health: int
    metrics: int


@dataclass
class EppSet:
    workdir: Path
    config_text: str
    replicas: int = 1
    shared: bool = False
    """The replicas share state through a local ``redis-server`` (``--workers`` groups always)."""
    workers: int = 1
    """``--workers`` of each replica (above 1 shares through Redis)."""
    tls: bool = False
    """ext_proc over TLS (the EPP's default); off: ``--secure-serving=false``."""
    seeds: bool = True
    """Each EPP gets ``--seed <i+1>``."""
    extra_args: Sequence[str] = ()
    envoy_max_streams: int = 0
    envoy_route_timeout: float = 300.0
    """Seconds Envoy lets a request take end to end."""
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
    ports: list[Ports] = field(default_factory=list)
    _config: Path | None = None

    @property
    def url(self) -> str:
        return self.envoy.url if self.envoy is not None else ""

    def http_url(self, i: int = 0) -> str:
        """Replica ``i``'s metrics port (``/metrics`` and the debug views)."""
        return f"http://127.0.0.1:{self.ports[i].metrics}"

    def metrics_url(self, i: int = 0) -> str:
        return f"{self.http_url(i)}/metrics"

    @property
    def _sharing(self) -> bool:
        return self.shared or self.workers > 1

    def prepare(self) -> EppSet:
        """Redis (when shared), the config file, the ports and the processes, none started."""
        if self._sharing and not available():
            raise SetupError(INSTALL_HINT)
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = self.config_text
        if self._sharing:
            redis_dir = self.workdir / "redis"
            redis_dir.mkdir(exist_ok=True)
            self.redis = RedisServer(redis_dir).start()
            text = with_syncer(text, self.redis.url, SYNC_INTERVAL)
        self._config = self.workdir / "epp-config.yaml"
        self._config.write_text(text)
        picks = free_ports(3 * self.replicas)  # all distinct: none is bound before the starts
        self.ports = [Ports(*picks[3 * i : 3 * i + 3]) for i in range(self.replicas)]
        self.procs = [self._proc(i) for i in range(self.replicas)]
        return self

    def start(self, timeout: float = START_TIMEOUT) -> EppSet:
        """Each EPP once the previous one serves ``/metrics``, then Envoy; with several
        replicas (all started), until Envoy finds them healthy."""
        try:
            self.prepare()
            for i in range(self.initial or self.replicas):
                self.start_replica(i, timeout)
            self.start_envoy()
            if self.replicas > 1 and not self.initial:
                self.wait_healthy(self.replicas, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> EppSet:
        """Every EPP started, without waiting for any (see ``start_envoy``)."""
        try:
            self.prepare()
            for proc in self.procs:
                proc.start()
        except BaseException:
            self.stop()
            raise
        return self

    def start_envoy(self) -> Envoy:
        """Envoy in front of every replica's ext_proc port (started slots or not)."""
        self.envoy = Envoy(
            self.envoy_config,
            epp_port=self.ports[0].grpc,
            fallback=self.fallback,
            epp_tls=self.tls,
            epp_replicas=[p.grpc for p in self.ports[1:]],
            epp_max_streams=self.envoy_max_streams,
            pool=self.envoy_pool,
            route_timeout=self.envoy_route_timeout,
        ).start()
        return self.envoy

    def _name(self, i: int) -> str:
        return "epp" if self.replicas == 1 else f"epp-{i}"

    def _proc(self, i: int) -> Proc:
        assert self._config is not None
        p = self.ports[i]
        # -P: the installed epp (or what PYTHONPATH names), never a package in the working directory
        argv = [sys.executable, "-P", "-m", "epp", "--config-file", str(self._config)]
        if not self.tls:
            argv.append("--secure-serving=false")
        argv += [
            "--grpc-port", str(p.grpc), "--grpc-health-port", str(p.health),
            "--metrics-port", str(p.metrics), "--bind-address", "127.0.0.1",
            "--drain-timeout", "0s",
        ]  # fmt: skip
        if self.seeds:
            argv += ["--seed", str(i + 1)]
        argv += [*self.extra_args, *self.slot_args.get(i, ())]
        if self.replicas > 1:
            argv.append("--health-checking")
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        name = self._name(i)
        return Proc(name, argv, self.workdir / f"{name}.log", env=self.env)

    def start_replica(self, i: int, timeout: float = START_TIMEOUT) -> None:
        """Start replica ``i`` (again) on its ports and wait until it serves metrics."""
        self.procs[i] = self._proc(i)
        self.procs[i].log_path = self.workdir / f"{self._name(i)}.{int(time.time() * 1000)}.log"
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
        out = {self._name(i): p.pid for i, p in enumerate(self.procs)}
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

    def describe(self, pods: int) -> str:
        """``epp stack``'s first line: what listens where."""
        first, pid = self.http_url(0), self.procs[0].pid
        if self.redis is None:
            return (
                f"stack: envoy {self.url} -> EPP :{self.ports[0].grpc} (TLS, pid {pid}) "
                f"-> {pods} simulated vLLM pods; EPP metrics {first}/metrics, "
                f"decisions {first}/debug/decisions"
            )
        eps = ", ".join(
            f":{p.grpc} (pid {proc.pid})" for p, proc in zip(self.ports, self.procs, strict=True)
        )
        metrics = ", ".join(self.metrics_url(i) for i in range(self.replicas))
        return (
            f"stack: envoy {self.url} -> {self.replicas} EPP replicas {eps} (TLS, "
            f"health-checked, sharing state through redis-server 127.0.0.1:{self.redis.port} "
            f"every {SYNC_INTERVAL}) -> {pods} simulated vLLM pods; EPP metrics {metrics}"
        )

    def admin_commands(self, model: str, prompt: str) -> list[str]:
        """``epp explain``, ``endpoints`` and ``state`` against each replica, ready to paste: its
        address, ``--insecure`` (the replicas serve TLS with their self-signed certificate) and,
        when ``$EPP_METRICS_TOKEN`` guards the admin API, a file holding that token."""
        script = Path(sys.executable).parent / "epp"
        epp = shlex.quote(str(script)) if script.exists() else f"{sys.executable} -m epp"
        flags = "--insecure"
        token = os.environ.get("EPP_METRICS_TOKEN", "")
        if token:
            path = self.workdir / "admin-token"
            path.write_text(token)
            flags += f" --token-file {shlex.quote(str(path))}"
        body = shlex.quote(json.dumps({"model": model, "prompt": prompt}))
        out = []
        for p in self.ports:
            target = f"{flags} --address 127.0.0.1:{p.grpc}"
            out += [f"{epp} explain {target} -d {body}", f"{epp} endpoints {target}"]
            out.append(f"{epp} state {target}")
        return out

    async def report(self, expected: int, timeout: float = 5.0) -> list[ReplicaReport]:
        """Each replica's share, once the replicas counted ``expected`` requests in all (a
        request is counted when its stream ends, a moment after the client has its answer)."""
        deadline = time.monotonic() + timeout
        urls = [self.http_url(i) for i in range(self.replicas)]
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                texts = [await _scrape(session, url) for url in urls]
                sums = [metric_sums(t) for t in texts]
                counted = sum(int(s.get(REQUESTS, 0)) for s in sums)
                if counted >= expected or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        streams = await asyncio.to_thread(envoy_streams, self.envoy) if self.envoy else {}
        return [
            _report(f"epp-{i}", self.procs[i].pid, self.ports[i].grpc, streams, s)
            for i, s in enumerate(sums)
        ]


def wait_endpoints(metrics_port: int, n: int, timeout: float = START_TIMEOUT) -> None:
    """Wait until the EPP on ``metrics_port`` lists ``n`` endpoints (discovery has synced)."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{metrics_port}/debug/endpoints"
            with direct_opener().open(url, timeout=2) as r:
                seen = len(json.loads(r.read())["endpoints"])
        except OSError:
            seen = -1
        if seen == n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the EPP lists {seen} endpoints, not {n}, after {timeout:g}s")


@dataclass(frozen=True)
class ReplicaReport:
    name: str
    pid: int
    grpc_port: int
    streams: int
    requests: int
    published: int
    applied: int
    errors: int
    lag: float | None
    bootstrapped: bool | None


def _report(
    name: str, pid: int, port: int, streams: dict[int, int], s: dict[str, float]
) -> ReplicaReport:
    synced = f"{SYNC}bootstrapped" in s
    return ReplicaReport(
        name=name,
        pid=pid,
        grpc_port=port,
        streams=streams.get(port, 0),
        requests=int(s.get(REQUESTS, 0)),
        published=int(s.get(f"{SYNC}published_facts_total", 0)),
        applied=int(s.get(f"{SYNC}applied_facts_total", 0)),
        errors=int(s.get(f"{SYNC}errors_total", 0)),
        lag=s.get(f"{SYNC}lag_seconds"),
        bootstrapped=bool(s[f"{SYNC}bootstrapped"]) if synced else None,
    )


async def _scrape(session: aiohttp.ClientSession, url: str) -> str:
    try:
        async with asyncio.timeout(5), session.get(f"{url}/metrics") as r:
            return await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return ""


def metric_sums(text: str) -> dict[str, float]:
    """Prometheus exposition text → each sample name's value summed over its labels."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def envoy_streams(envoy: Envoy) -> dict[int, int]:
    """ext_proc streams Envoy opened to each EPP port (its ``/clusters``); empty when the admin
    endpoint does not answer."""
    url = f"http://127.0.0.1:{envoy.admin_port}/clusters"
    try:
        with direct_opener().open(url, timeout=5) as r:
            return rq_totals(r.read().decode(), "epp")
    except (OSError, urllib.error.URLError):
        return {}


def rq_totals(clusters: str, cluster: str) -> dict[int, int]:
    """Port → ``rq_total`` of each host of ``cluster`` in Envoy's ``/clusters`` text (lines
    ``<cluster>::<ip>:<port>::rq_total::<n>``; health checks are not counted there)."""
    out: dict[int, int] = {}
    for line in clusters.splitlines():
        name, _, rest = line.partition("::")
        address, _, stat = rest.partition("::")
        if name == cluster and stat.startswith("rq_total::"):
            out[int(address.rsplit(":", 1)[1])] = int(stat.rsplit("::", 1)[1])
    return out


def report_table(rows: Sequence[ReplicaReport]) -> str:
    """One line per replica: its share of the traffic and of the shared state."""
    head = (
        f"{'replica':<8}{'pid':>8}{'ext_proc':>10}{'streams':>9}{'requests':>10}"
        f"{'facts out':>11}{'facts in':>10}{'sync err':>10}{'sync lag':>10}  replayed at start"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lag = f"{r.lag:.2f}s" if r.lag is not None else "-"
        replayed = {True: "yes", False: "no", None: "-"}[r.bootstrapped]
        lines.append(
            f"{r.name:<8}{r.pid:>8}{':' + str(r.grpc_port):>10}{r.streams:>9}{r.requests:>10}"
            f"{r.published:>11}{r.applied:>10}{r.errors:>10}{lag:>10}  {replayed}"
        )
    return "\n".join(lines)
