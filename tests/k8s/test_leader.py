"""Leader election on a Lease of the test API server: in-process Apps and two real ``epp``
processes contending for the lease."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from epp.k8s.client import KubeLeases, load_api_client
from epp.k8s.leader import Conflict, ElectionConfig, LeaderElector
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import LEASES, PODS, POOLS, pod, pool
from tests.k8s.conftest import (
    MODEL_LABELS,
    NOT_SERVING,
    POOL,
    SERVING,
    UNKNOWN,
    health,
    leader_and_follower,
    wait_serving,
)

LEASE_NAME = f"epp-default-{POOL}.llm-d.ai"
FAST = {"ha_lease_duration": 2.0, "ha_renew_deadline": 1.5, "ha_retry_period": 0.2}


def seed(server: LocalApiServer) -> None:
    server.create(POOLS, pool(POOL, MODEL_LABELS))
    server.create(PODS, pod("vllm-a", "127.0.0.2", MODEL_LABELS))


def holder(server: LocalApiServer) -> str:
    return str(server.get(LEASES, LEASE_NAME)["spec"].get("holderIdentity") or "")


async def test_health_answers_service_unknown_when_leader_election_is_on(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    app = await kube_app(apiserver, ha_enable_leader_election=True, **FAST)
    statuses = {
        name: app.health.status(name)
        for name in ("liveness", "readiness", "", "inference-extension")
    }
    assert statuses == {
        "liveness": SERVING,
        "readiness": SERVING,
        "": SERVING,
        "inference-extension": UNKNOWN,
    }
    assert holder(apiserver) == app.elector.config.identity


async def test_follower_takes_over_at_once_when_the_leader_drains(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    slow = {"ha_lease_duration": 30.0, "ha_renew_deadline": 20.0, "ha_retry_period": 0.2}
    first = await kube_app(apiserver, ha_enable_leader_election=True, **slow)
    second = await kube_app(apiserver, ha_enable_leader_election=True, ready=False, **slow)
    await asyncio.sleep(1.0)  # several retry periods: the second must stay a follower
    assert second.kube.ready()  # warm datastore...
    assert [e.id for e in second.store.snapshot()] == ["default/vllm-a-rank-0"]
    assert not second.ready()  # ...but not ready
    assert second.health.status("readiness") == NOT_SERVING
    t0 = time.monotonic()
    first.stop()  # drain: releases the lease long before its 30s expiry
    # A lease renewed at most 20 s (the renew deadline) before cannot expire within 10 s of the
    # stop: ready before then means released, whatever the machine's load.
    await second.wait_ready(9.5)
    assert time.monotonic() - t0 < 9.5
    lease = apiserver.get(LEASES, LEASE_NAME)["spec"]
    assert lease["holderIdentity"] == second.elector.config.identity
    assert lease["leaseTransitions"] == 1


async def test_a_draining_leader_stays_ready_until_its_successor_is(
    apiserver: LocalApiServer, kube_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epp.app.HANDOVER_GRACE", 0.5)
    seed(apiserver)
    slow = {"ha_lease_duration": 30.0, "ha_renew_deadline": 20.0, "ha_retry_period": 0.2}
    first = await kube_app(apiserver, ha_enable_leader_election=True, drain_timeout=20.0, **slow)
    second = await kube_app(apiserver, ha_enable_leader_election=True, ready=False, **slow)
    assert first.ready() and not second.ready()
    first.stop()
    async with asyncio.timeout(9.5):  # a release, not an expiry (see above)
        while not second.ready():
            assert first.ready() and not first.draining  # no moment without a ready replica
            await asyncio.sleep(0.01)
    async with asyncio.timeout(5):  # the grace, then draining
        while first.ready():
            await asyncio.sleep(0.01)
    assert first.draining and second.ready()


def test_stale_lease_write_is_refused_when_another_replica_wrote_first(
    apiserver: LocalApiServer, tmp_path: Path
) -> None:
    api = load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")))
    leases = KubeLeases(api, "default")
    electors = [
        LeaderElector(leases, ElectionConfig(LEASE_NAME, "default", name, 5.0, 3.0, 1.0))
        for name in ("a", "b")
    ]
    assert electors[0].try_acquire_or_renew() is True
    assert electors[1].try_acquire_or_renew() is False  # held and not expired
    stale = leases.get(LEASE_NAME)
    assert stale is not None
    assert electors[0].try_acquire_or_renew() is True  # renewal bumps the resourceVersion
    stale["spec"]["holderIdentity"] = "b"
    with pytest.raises(Conflict):
        leases.replace(stale)
    assert holder(apiserver) == "a"


# ---- two real processes ------------------------------------------------------------------------


@pytest.mark.slow
async def test_follower_becomes_ready_within_the_lease_duration_when_the_leader_is_killed(
    apiserver: LocalApiServer, epp_processes: Any, tmp_path: Path
) -> None:
    seed(apiserver)
    lease, renew, retry = 4.0, 2.0, 0.2
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    procs = [epp_processes(kubeconfig, lease, renew, retry) for _ in range(2)]
    (leader, _), (_, follower_port) = await leader_and_follower(procs)
    await asyncio.sleep(3 * retry)
    assert await health(follower_port) == NOT_SERVING  # still a follower after several retries
    leader.send_signal(signal.SIGKILL)  # no release: the follower must wait for expiry
    elapsed = await wait_serving(follower_port, 60)
    # One-sided: the leader renewed at most `renew` before it died (or it would have stepped
    # down), so the lease cannot have expired sooner than `lease - renew` after the kill; a
    # follower taking over a held lease (as on a release, a few retries) fails this. How late it
    # comes is bounded only by the wait, since a busy machine delays it.
    assert elapsed >= lease - renew - 0.3
    assert await health(follower_port, "inference-extension") == UNKNOWN


@pytest.mark.slow
@pytest.mark.timeout(300)  # the waits below bound hangs only
async def test_lease_is_released_when_the_leader_gets_sigterm(
    apiserver: LocalApiServer, epp_processes: Any, tmp_path: Path
) -> None:
    seed(apiserver)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    procs = [epp_processes(kubeconfig, 120.0, 15.0, 0.2, drain="20s") for _ in range(2)]
    (leader, leader_port), (_, follower_port) = await leader_and_follower(procs)
    leader.send_signal(signal.SIGTERM)
    # Released, not expired: a lease renewed at most 15 s before SIGTERM cannot expire within
    # 105 s, so the follower taking over inside the 100 s this waits proves the release (the
    # wait only bounds a hang; a busy machine delays the follower's next retry). Until then the
    # leader hands over: it stays ready, so that some replica always is.
    async with asyncio.timeout(100):
        while await health(follower_port) != SERVING:
            assert await health(leader_port) == SERVING
            await asyncio.sleep(0.05)
    # then draining: alive, but no longer ready (the 20 s drain surely lasts past the check)
    async with asyncio.timeout(15):
        while await health(leader_port) != NOT_SERVING:
            await asyncio.sleep(0.05)
    assert leader.poll() is None
    assert await health(leader_port, "liveness") == SERVING
    assert await asyncio.to_thread(leader.wait, 60) == 0
