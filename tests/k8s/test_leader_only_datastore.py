"""``haPopulateNonLeaderDatastore=false`` on the test API server: the Kubernetes watches run only
on the leader, so a follower has no endpoints, objectives or rewrites (a request reaching it gets
503) until it wins the lease, and a leader that loses the lease empties its datastore."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from epp.config.schema import UPSTREAM_DEFAULT_CONFIG_TEXT
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import LEASES, OBJECTIVES, PODS, POOLS, objective, pod, pool
from tests.conftest import body_msg, exchange, headers_msg, wait_for
from tests.k8s.conftest import MODEL_LABELS, NOT_SERVING, POOL, SERVING

LEASE_NAME = f"epp-default-{POOL}.llm-d.ai"
LEADER_ONLY = UPSTREAM_DEFAULT_CONFIG_TEXT + "featureGates: [haPopulateNonLeaderDatastore=false]\n"
ENDPOINT = "default/vllm-a-rank-0"
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
H = {":path": "/v1/chat/completions", ":method": "POST"}


def seed(server: LocalApiServer) -> None:
    server.create(POOLS, pool(POOL, MODEL_LABELS))
    server.create(PODS, pod("vllm-a", "127.0.0.2", MODEL_LABELS))
    server.create(OBJECTIVES, objective("chat", POOL, 5))


def endpoints(app: Any) -> list[str]:
    return [e.id for e in app.store.snapshot()]


async def routed_status(app: Any) -> int:
    """0 when routed, else the ImmediateResponse's HTTP status."""
    replies = await exchange(app, [headers_msg(H), body_msg(CHAT)])
    return replies[0].immediate_response.status.code


async def test_a_follower_has_no_datastore_until_it_leads(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    slow = {"ha_lease_duration": 30.0, "ha_renew_deadline": 20.0, "ha_retry_period": 0.2}
    leader = await kube_app(
        apiserver, config_text=LEADER_ONLY, ha_enable_leader_election=True, **slow
    )
    follower = await kube_app(
        apiserver, config_text=LEADER_ONLY, ha_enable_leader_election=True, ready=False, **slow
    )
    assert endpoints(leader) == [ENDPOINT] and leader.objectives.priority("chat") == 5
    assert await routed_status(leader) == 0
    await asyncio.sleep(1.0)  # several retry periods as a follower
    assert not follower.kube.reflectors  # no watch runs
    assert endpoints(follower) == [] and follower.objectives.priority("chat") == 0
    assert follower.health.status("readiness") == NOT_SERVING
    assert await routed_status(follower) == 503  # upstream's answer on a leader-only standby

    leader.stop()  # drain releases the lease: the follower leads and starts watching
    await follower.wait_ready(15)
    assert endpoints(follower) == [ENDPOINT] and follower.objectives.priority("chat") == 5
    assert await routed_status(follower) == 0


async def test_a_leader_that_loses_the_lease_empties_its_datastore(
    apiserver: LocalApiServer, kube_app: Any
) -> None:
    seed(apiserver)
    # loses leadership 1.5 s after another holder takes the lease; takes it back only once that
    # holder has not renewed for 10 s
    timing = {"ha_lease_duration": 10.0, "ha_renew_deadline": 1.5, "ha_retry_period": 0.2}
    app = await kube_app(
        apiserver, config_text=LEADER_ONLY, ha_enable_leader_election=True, **timing
    )
    assert endpoints(app) == [ENDPOINT]
    lease = apiserver.get(LEASES, LEASE_NAME)
    lease["spec"]["holderIdentity"] = "another-replica"
    apiserver.replace(LEASES, lease)
    await wait_for(lambda: not app.elector.is_leader(), timeout=10)
    await wait_for(lambda: endpoints(app) == [], timeout=5)
    assert app.objectives.priority("chat") == 0
    assert app.health.status("readiness") == NOT_SERVING
    assert await routed_status(app) == 503
    # the other holder never renews: the lease is taken back, the watches start again
    await app.wait_ready(30)
    assert endpoints(app) == [ENDPOINT] and app.objectives.priority("chat") == 5
    assert app.health.status("readiness") == SERVING
