"""Active-active: two EPP replicas behind one Envoy (ext_proc streams balanced round-robin over
the ready ones, gRPC health-checked), sharing the approximate prefix index through a real
``redis-server``. What one replica learns routes the other's requests; Redis going away, pausing
or being unreachable costs no request; a replica restarted under load is ready only once it has
replayed what its peer learned."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import redis

from epp.plugin import RequestBody
from epp_tools.stack.envoy import free_port
from tests.builders import make_request
from tests.conftest import metrics_text, post, wait_for

pytestmark = [pytest.mark.envoy]

PRODUCER = "approx-prefix-cache-producer"
HANG = 60.0
"""Seconds a wait may take before the test fails: a bound only a hang reaches (on a busy machine
a health-check round, a sync round or a request alone may take seconds)."""


def config(url: str | None, *, bootstrap: str = "3s") -> str:
    """Prefix affinity alone decides (ties broken at random, each replica with its own seed)."""
    syncer = (
        f"- type: redis-syncer\n  parameters: {{url: '{url}', timeout: 250ms, "
        f"bootstrapTimeout: {bootstrap}}}\n"
        if url
        else ""
    )
    data_layer = (
        "dataLayer:\n  crossReplicaSyncerPluginRef: redis-syncer\n"
        "  crossReplicaSyncInterval: 50ms\n"
        if url
        else ""
    )
    return (
        "plugins:\n" + syncer + "- type: prefix-cache-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: prefix-cache-scorer\n"
        + data_layer
    )


def prompt(i: int) -> str:
    rng = random.Random(i)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(300))  # 2.4 KB: 9 blocks


async def start_replica(start_app: Any, fleet: Any, url: str | None, seed: int, **kw: Any) -> Any:
    return await start_app(fleet.ports, config(url, **kw.pop("cfg", {})), health_checking=True,
                           seed=seed, **kw)  # fmt: skip


async def send(proxy: Any, i: int, rid: str = "") -> tuple[int, str]:
    headers = {"x-request-id": rid} if rid else {}
    body = {"model": "sim-model", "prompt": prompt(i), "max_tokens": 2}
    status, hdrs, _ = await post(f"{proxy.url}/v1/completions", body, headers)
    return status, hdrs.get("x-sim-pod", "")


def handler(replicas: Sequence[Any], rid: str) -> int:
    (index,) = [i for i, app in enumerate(replicas) if app.decisions.get(rid) is not None]
    return index


def metric(text: str, line: str) -> float:
    for row in text.splitlines():
        if row.startswith(line + " "):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


async def scraped(app: Any, predicate: Callable[[str], bool]) -> str:
    """The App's /metrics text, once ``predicate`` holds for it."""
    async with asyncio.timeout(HANG):
        while not predicate(text := await metrics_text(app)):
            await asyncio.sleep(0.05)
    return text


def sync_errors(text: str) -> float:
    rows = [r for r in text.splitlines() if r.startswith("llm_d_epp_state_sync_errors_total")]
    return sum(float(r.rsplit(" ", 1)[1]) for r in rows)


def stale(text: str) -> bool:
    """The replica has not heard from Redis for over a second."""
    return metric(text, "llm_d_epp_state_sync_lag_seconds") > 1.0


def lagging(text: str) -> bool:
    """Not heard from Redis for over a second, and counted failed calls."""
    return stale(text) and sync_errors(text) > 0


async def pause(server: Any, seconds: float) -> None:
    """Redis answers no client for ``seconds`` (sent from a thread: the replicas share this
    event loop, which a blocking call would stall, health checks and all)."""
    command = ("CLIENT", "PAUSE", str(int(seconds * 1000)), "ALL")
    await asyncio.to_thread(server.client().execute_command, *command)


async def unpaused(server: Any) -> None:
    """Until Redis answers a PING again (the client's own timeout is shorter than a pause)."""
    client = server.client()
    async with asyncio.timeout(HANG):
        while True:
            try:
                await asyncio.to_thread(client.ping)
                return
            except redis.exceptions.TimeoutError:
                continue


@dataclass
class Load:
    """Closed-loop load through Envoy: ``workers`` clients cycling over prompts."""

    url: str
    prompts: Sequence[int]
    workers: int = 4
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed_at: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    """The failed answers (status, headers, start of the body), for the failure message."""
    """When each failed request was sent (seconds since ``start``), for the failure message."""
    started: float = 0.0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> Load:
        self.started = time.monotonic()
        self._tasks = [asyncio.create_task(self._worker(w)) for w in range(self.workers)]
        return self

    async def _worker(self, w: int) -> None:
        async with aiohttp.ClientSession() as s:
            n = w
            while not self._stop.is_set():
                i = self.prompts[n % len(self.prompts)]
                body = {"model": "sim-model", "prompt": prompt(i), "max_tokens": 2}
                n += self.workers
                started = time.monotonic()
                try:
                    async with s.post(f"{self.url}/v1/completions", json=body) as r:
                        text = await r.read()
                        self.statuses[r.status] += 1
                        if r.status != 200:
                            self.failed_at.append(round(started - self.started, 2))
                            self.answers.append(f"{r.status} {r.headers} {text[:100]!r}")
                except aiohttp.ClientError as exc:
                    self.errors.append(repr(exc))
                self.latencies.append(time.monotonic() - started)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    @property
    def failed(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200) + len(self.errors)

    @property
    def report(self) -> tuple[Any, ...]:
        """What failed, when (seconds since start) and how: the failure message."""
        return self.statuses, self.errors[:3], self.failed_at[:5], self.answers[:2]

    @property
    def done(self) -> int:
        return sum(self.statuses.values()) + len(self.errors)

    async def served(self, more: int) -> None:
        """Until ``more`` further requests have been answered."""
        target = self.done + more
        await wait_for(lambda: self.done >= target, HANG)


async def pairs(
    proxy: Any, replicas: Sequence[Any], prompts: Sequence[int], fleet: Any = None
) -> list[bool]:
    """Each prompt sent to one replica, then again until the other replica handles it: did both
    reach the same pod? With ``fleet`` (shared state) the second send waits until the other
    replica's prefix index has the first pod as the prompt's best match (the sync delivered it);
    without sharing there is nothing to wait for."""
    same = []
    for i in prompts:
        tag = f"{i}-{time.monotonic_ns()}"
        status, first_pod = await send(proxy, i, rid=f"{tag}-0")
        assert status == 200
        first = handler(replicas, f"{tag}-0")
        if fleet is not None:
            other = replicas[1 - first]
            pods = {e.id: f"pod-{fleet.ports.index(e.port)}" for e in other.store.snapshot()}
            async with asyncio.timeout(HANG):
                while await best_pod(other, i, pods) != first_pod:
                    await asyncio.sleep(0.02)
        for attempt in range(1, 8):
            status, pod = await send(proxy, i, rid=f"{tag}-{attempt}")
            assert status == 200
            if handler(replicas, f"{tag}-{attempt}") != first:
                same.append(pod == first_pod)
                break
    return same


async def envoy_for(envoy: Any, replicas: Sequence[Any]) -> Any:
    """Envoy in front of the replicas, once each has routed a request through it: healthy in
    Envoy's stats is not yet in rotation, and until Envoy has connected to every replica it
    may send every stream to the first one (seen for seconds on a busy machine)."""
    proxy = envoy(replicas[0], epp_replicas=[r.grpc_port for r in replicas[1:]])
    await proxy.wait_healthy(len(replicas), timeout=HANG)
    async with asyncio.timeout(HANG):
        k = 0
        while not all(app.decisions.latest(1) for app in replicas):
            assert (await send(proxy, 10_000 + k))[0] == 200
            k += 1
    return proxy


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "control-not-shared"])
async def test_prefix_learned_by_one_replica_routes_the_others_request_to_that_pod(
    start_app, sim_pods, envoy, redis_server, shared: bool
) -> None:
    url = redis_server().url if shared else None
    fleet = await sim_pods(4)
    a = await start_replica(start_app, fleet, url, seed=1)
    b = await start_replica(start_app, fleet, url, seed=2)
    proxy = await envoy_for(envoy, [a, b])
    # the control needs more prompts: a chance match is 1 in 4, and 12 prompts gave half of them
    # (the bound) in about 1 run of 18; 36 give it in about 1 of 900
    prompts = range(12 if shared else 36)
    same = await pairs(proxy, [a, b], prompts, fleet if shared else None)
    assert len(same) >= len(prompts) - 2
    if shared:
        assert all(same), same
    else:  # the control: without sharing, the other replica picks at random among 4 pods
        assert sum(same) < len(same) / 2, same


async def test_redis_killed_under_load_then_restarted_fails_no_request_and_sharing_resumes(
    start_app, sim_pods, envoy, redis_server
) -> None:
    server = redis_server()
    fleet = await sim_pods(4)
    a = await start_replica(start_app, fleet, server.url, seed=1)
    b = await start_replica(start_app, fleet, server.url, seed=2)
    proxy = await envoy_for(envoy, [a, b])
    load = Load(proxy.url, range(100, 140)).start()
    await load.served(8)
    await asyncio.to_thread(server.kill)  # the replicas share this event loop: never block it
    # both replicas notice (a second without Redis, failed calls), and requests go on meanwhile
    outage = [await scraped(app, lagging) for app in (a, b)]
    await load.served(20)
    await asyncio.to_thread(server.start)  # same port, empty
    for app in (a, b):  # sharing resumes: both replicas hear from Redis again
        await scraped(app, lambda t: metric(t, "llm_d_epp_state_sync_lag_seconds") < 0.5)
    await load.stop()
    assert load.failed == 0, load.report
    # generous and one-sided: a request that waited on Redis would have failed or taken the
    # syncer's timeouts; on a busy machine a request alone may take a second or two
    assert max(load.latencies) < 5.0
    assert all(lagging(text) for text in outage)
    same = await pairs(proxy, [a, b], range(200, 206), fleet)  # new to both: learned now
    assert len(same) == 6 and all(same), same


async def test_replica_partitioned_from_redis_starts_and_keeps_routing(
    start_app, sim_pods, envoy, redis_server
) -> None:
    server = redis_server()
    fleet = await sim_pods(4)
    a = await start_replica(start_app, fleet, server.url, seed=1)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    b = await start_replica(start_app, fleet, unreachable, seed=2, cfg={"bootstrap": "1s"})
    assert time.monotonic() - started >= 0.9  # ready once the bootstrap wait is over
    assert not b.sync.bootstrapped
    proxy = await envoy_for(envoy, [a, b])
    load = Load(proxy.url, range(300, 330)).start()
    await wait_for(lambda: b.sync.lag() > 2.0, 60)  # B never hears from Redis: its lag grows
    # both replicas serve: awaited, since a busy machine serves fewer requests in 2 s
    await wait_for(lambda: min(len(app.decisions.latest(10_000)) for app in (a, b)) > 10, 60)
    await load.stop()
    assert load.failed == 0, load.report
    text = await metrics_text(b)
    assert metric(text, "llm_d_epp_state_sync_lag_seconds") > 2.0
    assert metric(text, 'llm_d_epp_state_sync_errors_total{operation="replay"}') > 0
    assert metric(await metrics_text(a), "llm_d_epp_state_sync_lag_seconds") < 0.5


PAUSE = 10.0
"""Seconds Redis answers nobody in the pause test: long beside a slow request on a busy
machine."""


async def test_paused_redis_delays_no_request(start_app, sim_pods, envoy, redis_server) -> None:
    server = redis_server()
    fleet = await sim_pods(4)
    a = await start_replica(start_app, fleet, server.url, seed=1)
    b = await start_replica(start_app, fleet, server.url, seed=2)
    proxy = await envoy_for(envoy, [a, b])
    load = Load(proxy.url, range(400, 440)).start()
    await load.served(8)
    await pause(server, PAUSE)
    paused = [await scraped(app, stale) for app in (a, b)]  # both replicas wait on Redis
    await load.served(20)  # and requests go on meanwhile
    await unpaused(server)
    await load.stop()
    assert load.failed == 0, load.report
    # one-sided, and generous for a busy machine: a request that waited for Redis would have
    # taken the rest of the pause, over half of it for any sent in its first half
    assert max(load.latencies) < PAUSE / 2
    assert all(stale(text) for text in paused)
    same = await pairs(proxy, [a, b], range(500, 504), fleet)
    assert len(same) == 4 and all(same), same


DRAIN = 10.0
"""The drained replica's --drain-timeout: the window in which Envoy must take it out of rotation
(its health check runs every 0.2 s, so only a machine too busy to answer misses it)."""


async def test_replica_restarted_under_load_is_ready_only_after_catching_up(
    start_app, sim_pods, envoy, redis_server
) -> None:
    server = redis_server()
    fleet = await sim_pods(4)
    port_b = free_port()
    a = await start_replica(start_app, fleet, server.url, seed=1)
    b = await start_replica(start_app, fleet, server.url, seed=2, grpc_port=port_b,
                            drain_timeout=DRAIN)  # fmt: skip
    proxy = await envoy_for(envoy, [a, b])
    load = Load(proxy.url, range(600, 640)).start()
    await load.served(8)
    events = {"stop": time.monotonic() - load.started}
    b.stop()  # drains: NOT_SERVING, Envoy stops sending it streams, then it stops
    async with asyncio.timeout(DRAIN):  # Envoy's health check sees it within the drain window
        while (await asyncio.to_thread(proxy.stats)).get("cluster.epp.membership_healthy", 0) > 1:
            await asyncio.sleep(0.05)
    events["out"] = time.monotonic() - load.started
    # Bounded here: pytest-timeout's alarm is raised inside an event-loop callback under this
    # load, where asyncio logs it and carries on, so an unbounded wait would never end.
    async with asyncio.timeout(HANG):
        await b._runner
    events["gone"] = time.monotonic() - load.started
    # While B is away, A alone learns where a new set of prompts lives.
    learned = {}
    for i in range(700, 716):
        status, pod = await send(proxy, i)
        assert status == 200
        learned[i] = pod
    a.sync.collect()  # what A learned is in its outbox: wait until it is published
    await wait_for(lambda: a.sync.outbox_size == 0, HANG)
    # Redis answers nothing for 1.5 s: B's discovery and first scrape are done long before its
    # replay can be, and readiness waits for the replay (its bootstrap wait is 3 s).
    await pause(server, 1.5)
    paused = time.monotonic()
    b2 = await start_replica(start_app, fleet, server.url, seed=3, grpc_port=port_b, ready=False)
    async with asyncio.timeout(HANG):
        while not b2.ready():
            await asyncio.sleep(0.001)
    assert time.monotonic() - paused >= 1.4
    events["ready"] = time.monotonic() - load.started
    # The moment it is ready it already knows what A learned while it was away.
    assert b2.sync.bootstrapped
    pods = {e.id: f"pod-{fleet.ports.index(e.port)}" for e in b2.store.snapshot()}
    for i, pod in learned.items():
        assert await best_pod(b2, i, pods) == pod
    await proxy.wait_healthy(2, timeout=HANG)
    await wait_for(lambda: len(b2.decisions.latest(10_000)) > 0, HANG)  # B is back in rotation
    await load.stop()
    assert load.failed == 0, (load.report, events)
    for i, pod in learned.items():  # now either replica may answer: same pod
        assert (await send(proxy, i))[1] == pod


async def best_pod(app: Any, i: int, pods: dict[str, str]) -> str:
    """The pod on which the App's prefix index matches prompt ``i`` best (its own producers)."""
    payload = {"model": "sim-model", "prompt": prompt(i), "max_tokens": 2}
    body = RequestBody(kind="completions", payload=payload, raw=json.dumps(payload).encode())
    request = make_request(body=body, target_model="sim-model")
    endpoints = app.store.snapshot()
    await app.plugin("token-producer").produce(request, endpoints)
    await app.plugin(PRODUCER).produce(request, endpoints)
    infos = request.attributes[f"PrefixCacheMatchInfo/{PRODUCER}"]
    best = max(infos, key=lambda ep: infos[ep].match_blocks)
    return pods[best] if infos[best].match_blocks else ""
