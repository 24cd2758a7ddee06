"""The EPP processes of ``epp stack``: one, or with ``--replicas N`` (N ≥ 2) N active-active
replicas sharing routing state through a local ``redis-server``.

Each EPP is its own ``python -m epp`` process with TLS on (as by default), listening on
127.0.0.1 with free ports. With several replicas:

- a ``redis-server`` is started on a free 127.0.0.1 port, without persistence (``--save ''
  --appendonly no``), in a directory of the run (``epp_tools.stack.redis``);
- every replica's config is the stack's config plus a ``redis-syncer`` on it and
  ``dataLayer.crossReplicaSyncerPluginRef`` / ``crossReplicaSyncInterval: 200ms``
  (``epp_tools.stack.eppconfig.with_syncer``);
- every replica serves ``grpc.health.v1`` on its ext_proc port (``--health-checking``) and has
  its own ``--seed`` (1, 2, ...: ties break differently per replica, as in a deployment), so one
  Envoy can balance ext_proc streams round-robin over the replicas it finds SERVING.

``report`` tells what each replica did: the ext_proc streams Envoy sent it (its ``/clusters``
``rq_total``), the requests it handled (``llm_d_epp_request_total``) and its cross-replica sync
(``llm_d_epp_state_sync_*``: facts published and applied, errors, lag, whether it replayed the
log at start). ``stop`` stops the replicas, then Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from epp_tools.stack.envoy import Envoy, free_port
from epp_tools.stack.eppconfig import with_syncer
from epp_tools.stack.procs import Proc, direct_opener
from epp_tools.stack.redis import INSTALL_HINT, RedisServer, available

SYNC_INTERVAL: Final = "200ms"
REQUESTS: Final = "llm_d_epp_request_total"
SYNC: Final = "llm_d_epp_state_sync_"


class SetupError(Exception):
    """The replicas cannot run here (no ``redis-server``)."""


def check_replicas(replicas: int) -> None:
    """Raise ``SetupError`` when ``replicas`` cannot run on this machine."""
    if replicas > 1 and not available():
        raise SetupError(f"--replicas {replicas} needs a shared Redis, but {INSTALL_HINT}")


@dataclass
class Replica:
    """One EPP process and its ports."""

    proc: Proc
    grpc_port: int
    metrics_port: int

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"


def epp_replica(
    config: Path,
    log: Path,
    *,
    experimental: bool = False,
    seed: int = 0,
    health: bool = False,
) -> Replica:
    """An EPP process on free 127.0.0.1 ports (not started)."""
    grpc_port, metrics_port = free_port(), free_port()
    argv = [
        sys.executable, "-m", "epp", "--config-file", str(config),
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
        "--metrics-port", str(metrics_port), "--bind-address", "127.0.0.1",
        "--drain-timeout", "0s",
    ]  # fmt: skip
    if experimental:
        argv.append("--allow-experimental-plugins")
    if seed:
        argv += ["--seed", str(seed)]
    if health:
        argv.append("--health-checking")
    return Replica(Proc(log.stem, argv, log), grpc_port, metrics_port)


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


@dataclass
class EppGroup:
    """The stack's EPP replicas (and their Redis when there are several)."""

    workdir: Path
    config_text: str
    replicas: int = 1
    experimental: bool = False
    redis: RedisServer | None = None
    members: list[Replica] = field(default_factory=list)

    def start(self) -> EppGroup:
        check_replicas(self.replicas)
        self.workdir.mkdir(parents=True, exist_ok=True)
        text = self.config_text
        try:
            if self.replicas > 1:
                (self.workdir / "redis").mkdir(exist_ok=True)
                self.redis = RedisServer(self.workdir / "redis")
                self.redis.start()
                text = with_syncer(text, self.redis.url, SYNC_INTERVAL)
            config = self.workdir / "epp-config.yaml"
            config.write_text(text)
            for i in range(self.replicas):
                several = self.replicas > 1
                log = self.workdir / (f"epp-{i}.log" if several else "epp.log")
                member = epp_replica(
                    config, log, experimental=self.experimental, seed=i + 1 if several else 0,
                    health=several,
                )  # fmt: skip
                self.members.append(member)
                member.proc.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for member in self.members:
            member.proc.stop()
        if self.redis is not None:
            self.redis.stop()

    def __enter__(self) -> EppGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
        for m in self.members:
            target = f"{flags} --address 127.0.0.1:{m.grpc_port}"
            out += [f"{epp} explain {target} -d {body}", f"{epp} endpoints {target}"]
            out.append(f"{epp} state {target}")
        return out

    def envoy(self) -> Envoy:
        """Envoy in front of every replica (not started)."""
        ports = [m.grpc_port for m in self.members]
        return Envoy("full-duplex", epp_port=ports[0], epp_tls=True, epp_replicas=ports[1:])

    def describe(self, envoy_url: str, pods: int) -> str:
        """The stack's first line: what listens where."""
        first = self.members[0]
        if self.redis is None:
            return (
                f"stack: envoy {envoy_url} -> EPP :{first.grpc_port} (TLS, pid {first.proc.pid}) "
                f"-> {pods} simulated vLLM pods; EPP metrics {first.metrics_url}/metrics, "
                f"decisions {first.metrics_url}/debug/decisions"
            )
        eps = ", ".join(f":{m.grpc_port} (pid {m.proc.pid})" for m in self.members)
        metrics = ", ".join(f"{m.metrics_url}/metrics" for m in self.members)
        return (
            f"stack: envoy {envoy_url} -> {len(self.members)} EPP replicas {eps} (TLS, "
            f"health-checked, sharing state through redis-server 127.0.0.1:{self.redis.port} "
            f"every {SYNC_INTERVAL}) -> {pods} simulated vLLM pods; EPP metrics {metrics}"
        )

    async def report(
        self, envoy: Envoy, expected: int, timeout: float = 5.0
    ) -> list[ReplicaReport]:
        """Each replica's share, once the replicas counted ``expected`` requests in all (a
        request is counted when its stream ends, a moment after the client has its answer)."""
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(trust_env=False) as session:
            while True:
                texts = [await _scrape(session, m.metrics_url) for m in self.members]
                sums = [metric_sums(t) for t in texts]
                counted = sum(int(s.get(REQUESTS, 0)) for s in sums)
                if counted >= expected or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        streams = await asyncio.to_thread(envoy_streams, envoy)
        return [
            _report(f"epp-{i}", m, streams.get(m.grpc_port, 0), s)
            for i, (m, s) in enumerate(zip(self.members, sums, strict=True))
        ]


def _report(name: str, m: Replica, streams: int, s: dict[str, float]) -> ReplicaReport:
    synced = f"{SYNC}bootstrapped" in s
    return ReplicaReport(
        name=name,
        pid=m.proc.pid,
        grpc_port=m.grpc_port,
        streams=streams,
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
