"""The rig of ``epp bench day2``: a pool of simulated pods registered in the local Kubernetes API
server (``epp_tools.bench.kube.apiserver``), EPP processes in Kubernetes mode behind the Envoy
config ``epp envoy-config`` generates (``epp_tools.stack.replicas.EppSet``), and steady agentic
load.

Pods: one ``epp sim`` process each, on its own loopback address and one shared port, as pods of
an InferencePool; replacement pods get addresses of their own (127.0.0.10 on), and Envoy's
model-server cluster lists every address the run will use, as a gateway fed from the pool's
endpoints would (``--pool-endpoint``: a retry goes to another pod, a failing pod is ejected).
EPP replicas: ``slots`` port sets Envoy health-checks, ``initial`` of them started; a rolling
update starts a new slot and stops an old one, as a Deployment replaces a pod behind its Service.

Load: ``clients`` agents sending the turns of agentic sessions
(``epp_tools.bench.runner.agentload``): the hit ratio is what the model servers report as cached
prompt tokens. Times are seconds since the load started (``Outcome.sent``); ``Phase`` windows
measure before, during and after an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import tempfile
import time
import urllib.error
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp_tools.bench.fleet import PodSet
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import PODS, POOLS, pod, pool
from epp_tools.bench.runner.agentload import AgentLoad, agent_sessions, between, hit_ratio
from epp_tools.bench.runner.driver import Outcome, warm_up
from epp_tools.bench.workloads.spec import FleetSpec
from epp_tools.stack.envoy import free_port
from epp_tools.stack.procs import direct_opener
from epp_tools.stack.replicas import EppSet, wait_endpoints

POOL = "vllm-pool"
LABELS = {"app": "vllm"}
PODS_N = 4
SESSIONS = 800
RECOVERED = 0.95


@dataclass
class Day2Options:
    out: Path = Path("out/day2")
    scenarios: list[str] = field(default_factory=list)
    clients: int = 6
    before: float = 8.0
    after: float = 8.0
    drain: float = 3.0
    """--drain-timeout of the EPP replicas (seconds)."""
    lease: float = 4.0
    """--ha-lease-duration (renew deadline 0.7x, retry period 0.2x of it)."""
    window: float = 10.0
    """Leader crash: seconds of the standby's routing compared with the old leader's."""
    rolled: int = PODS_N
    """Model servers replaced one after another."""
    time_scale: float = 10.0
    seed: int = 1
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="epp-day2-")))


def log(message: str) -> None:
    print(f"bench day2: {message}", flush=True)


def fleet(opts: Day2Options) -> FleetSpec:
    return FleetSpec(pods=1, num_gpu_blocks=4_000, max_model_len=65_536, time_scale=opts.time_scale)


def pod_host(i: int) -> str:
    """The address of pod ``i``: 127.0.0.2-5 for the first four, 127.0.0.10 on for new ones."""
    return f"127.0.0.{i + 2}" if i < PODS_N else f"127.0.0.{i + 6}"


@dataclass
class Stage:
    opts: Day2Options
    workdir: Path
    api: LocalApiServer
    pods: dict[str, PodSet]
    port: int
    epp: EppSet

    def add_pod(self, i: int) -> str:
        """Start pod ``i`` and register it (Ready) in the API server; returns its name."""
        spec = fleet(self.opts)
        podset = PodSet(self.workdir, spec, 1, [pod_host(i)], self.port, first=i).start()
        name = podset.names[0]
        self.pods[name] = podset
        self.api.create(PODS, pod(name, pod_host(i), LABELS))
        return name

    def healthy_slots(self) -> set[int]:
        """EPP slots Envoy's health check finds SERVING now."""
        assert self.epp.envoy is not None
        url = f"http://127.0.0.1:{self.epp.envoy.admin_port}/clusters"
        text = ""
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            direct_opener().open(url, timeout=5) as r,
        ):
            text = r.read().decode()
        out = set()
        for i, p in enumerate(self.epp.ports):
            if f"epp::127.0.0.1:{p.grpc}::health_flags::healthy" in text:
                out.add(i)
        return out

    async def wait_slots(self, check: object, timeout: float = 60.0) -> set[int]:
        """Until ``check(healthy_slots)`` holds; returns the slots then."""
        assert callable(check)
        deadline = time.monotonic() + timeout
        while True:
            slots = await asyncio.to_thread(self.healthy_slots)
            if check(slots):
                return slots
            if time.monotonic() > deadline:
                raise TimeoutError(f"EPP slots healthy: {sorted(slots)}")
            await asyncio.sleep(0.05)

    def envoy_stat(self, name: str) -> int:
        assert self.epp.envoy is not None
        return self.epp.envoy.stats().get(name, 0)


def kube_args(api: LocalApiServer, workdir: Path) -> list[str]:
    kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
    return [
        "--kubeconfig", str(kubeconfig), "--pool-name", POOL, "--pool-namespace", "default",
        "--metrics-endpoint-auth=false",
    ]  # fmt: skip


def ha_args(opts: Day2Options) -> list[str]:
    lease = opts.lease
    return [
        "--ha-enable-leader-election",
        f"--ha-lease-duration={lease:g}s",
        f"--ha-renew-deadline={0.7 * lease:g}s",
        f"--ha-retry-period={0.2 * lease:g}s",
    ]


@contextlib.asynccontextmanager
async def stage(
    opts: Day2Options,
    name: str,
    *,
    slots: int,
    initial: int,
    shared: bool,
    extra: Sequence[str] = (),
    slot_args: dict[int, list[str]] | None = None,
    serving: int | None = None,
    replacements: bool = False,
) -> AsyncIterator[Stage]:
    """Pods, the API server, ``initial`` of ``slots`` EPP replicas behind Envoy, torn down at the
    end; ready once ``serving`` replicas (default ``initial``) pass Envoy's health check and the
    load's first request is answered. Envoy's model-server cluster lists the running pods, and
    with ``replacements`` the addresses of the pods a roll will start (as a gateway fed from the
    pool's endpoints would: an address with no pod behind it would take retries and fail them)."""
    workdir = opts.workdir / name
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    api = LocalApiServer(bookmark_interval=0.5)
    every = [(pod_host(i), port) for i in range(PODS_N + (opts.rolled if replacements else 0))]
    epp = EppSet(
        workdir / "epp", DEFAULT_CONFIG_TEXT, replicas=slots, initial=initial, shared=shared,
        slot_args=slot_args or {}, envoy_pool=every,
    )  # fmt: skip
    st = Stage(opts, workdir, api, {}, port, epp)
    try:
        api.start()
        api.create(POOLS, pool(POOL, LABELS, (port,)))
        for i in range(PODS_N):
            await asyncio.to_thread(st.add_pod, i)
        drain = [f"--drain-timeout={opts.drain:g}s"]
        epp.extra_args = [*kube_args(api, workdir), *drain, *extra]
        await asyncio.to_thread(epp.start)
        for i in range(initial):
            await asyncio.to_thread(wait_endpoints, epp.ports[i].metrics, PODS_N)
        want = initial if serving is None else serving
        await st.wait_slots(lambda s: len(s) >= want)
        await warm_up(epp.url)
        yield st
    finally:
        await asyncio.to_thread(epp.stop)
        api.stop()
        for podset in st.pods.values():
            await asyncio.to_thread(podset.stop)


@dataclass
class Running:
    """Steady agentic load: ``start`` is the ``perf_counter`` time ``Outcome.sent`` counts from."""

    load: AgentLoad
    start: float
    task: asyncio.Task[list[Outcome]]

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def finish(self, after: float) -> list[Outcome]:
        """Keep the load on ``after`` more seconds, then stop it (turns in flight finish)."""
        await asyncio.sleep(after)
        self.load.stop_at = time.perf_counter()
        return await self.task


async def run_load(opts: Day2Options, url: str, *, backoff: float = 0.05) -> Running:
    sessions = agent_sessions(SESSIONS, 8, opts.seed, fleet(opts))
    load = AgentLoad(url, sessions, clients=opts.clients, request_timeout=30.0, backoff=backoff)
    start = time.perf_counter()
    task = asyncio.create_task(load.run(start, start + 3600.0))
    await asyncio.sleep(opts.before)
    return Running(load, start, task)


def ttft_ms(outcomes: Sequence[Outcome], q: float) -> float:
    values = sorted(o.ttft for o in outcomes if o.ok and not math.isnan(o.ttft))
    if not values:
        return math.nan
    if len(values) == 1:
        return 1000.0 * values[0]
    return 1000.0 * statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


@dataclass
class Phases:
    """Outcomes split at the event: ``[settle, t0)`` before, ``[t0, t1)`` during, after ``t1``."""

    outcomes: list[Outcome]
    t0: float
    t1: float
    settle: float = 2.0

    @property
    def before(self) -> list[Outcome]:
        return between(self.outcomes, self.settle, self.t0)

    @property
    def during(self) -> list[Outcome]:
        return between(self.outcomes, self.t0, self.t1)

    @property
    def after(self) -> list[Outcome]:
        return between(self.outcomes, self.t1, math.inf)

    def hits(self) -> tuple[float, float, float]:
        return hit_ratio(self.before), hit_ratio(self.during), hit_ratio(self.after)

    def added_ttft_ms(self) -> tuple[float, float]:
        """TTFT p50 and p95 during the event less before it."""
        return (
            ttft_ms(self.during, 0.5) - ttft_ms(self.before, 0.5),
            ttft_ms(self.during, 0.95) - ttft_ms(self.before, 0.95),
        )
