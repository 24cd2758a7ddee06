"""Two EPP Apps in one process sharing routing facts through a real ``redis-server``: the loop
runs as an App background task, readiness waits for the bootstrap (boundedly), metrics show."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from epp.plugin import ProfileResult, SchedulingResult, TokenizedPrompt
from epp_tools.stack.envoy import free_port
from tests.builders import make_request
from tests.conftest import metrics_text, wait_for

PRODUCER = "approx-prefix-cache-producer"
TOKENS_KEY = "TokenizedPrompt/token-producer"
KEY = f"PrefixCacheMatchInfo/{PRODUCER}"


def body(url: str, *, bootstrap: str = "2s") -> str:
    return f"""\
        plugins:
        - type: redis-syncer
          parameters: {{url: "{url}", timeout: 200ms, bootstrapTimeout: {bootstrap}}}
        - type: prefix-cache-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: prefix-cache-scorer
        dataLayer:
          crossReplicaSyncerPluginRef: redis-syncer
          crossReplicaSyncInterval: 50ms
        """


def request(first: int) -> Any:
    prompt = TokenizedPrompt.from_token_ids([[first, *range(1, 640)]])
    return make_request(target_model="m", attributes={TOKENS_KEY: prompt})


async def learn(app: Any, first: int, target: int) -> None:
    """The App's producer sees a request for prompt ``first`` scheduled to endpoint ``target``."""
    p, pool = app.plugin(PRODUCER), sorted(app.store.snapshot(), key=lambda e: e.port)
    req = request(first)
    await p.produce(req, pool)
    result = SchedulingResult({"default": ProfileResult(targets=(pool[target],))}, "default")
    p.pre_request(req, result)


async def best(app: Any, first: int) -> dict[int, int]:
    """Port → matched blocks of prompt ``first`` in the App's index."""
    pool = app.store.snapshot()
    req = request(first)
    await app.plugin(PRODUCER).produce(req, pool)
    by_id = {e.id: e.port for e in pool}
    return {by_id[i]: m.match_blocks for i, m in req.attributes[KEY].items() if m.match_blocks}


async def test_a_prefix_one_app_learns_is_matched_by_the_other(start_app, redis_server) -> None:
    server = redis_server()
    ports = [free_port() for _ in range(3)]
    a = await start_app(ports, body(server.url))
    b = await start_app(ports, body(server.url))
    await learn(a, 11, target=2)
    await wait_for(lambda: b.plugin(PRODUCER).index.size > 0, 5)
    assert await best(b, 11) == {sorted(ports)[2]: 10}
    assert await best(b, 12) == {}
    text = await metrics_text(b)
    assert f'llm_d_epp_state_sync_applied_facts_total{{plugin_name="{PRODUCER}"}} 1.0' in text
    assert "llm_d_epp_state_sync_bootstrapped 1.0" in text
    assert a.pipeline.describe()["crossReplicaSyncer"] == "redis-syncer/redis-syncer"


async def test_a_starting_app_is_ready_only_with_the_logs_tail_applied(
    start_app, redis_server
) -> None:
    server = redis_server()
    ports = [free_port() for _ in range(3)]
    a = await start_app(ports, body(server.url))
    for i in range(20):
        await learn(a, 100 + i, target=i % 3)
    await asyncio.sleep(0.3)  # published
    # Redis stalls for 1 s: discovery and the first scrape finish first, the replay after.
    server.client().execute_command("CLIENT", "PAUSE", "1000", "ALL")
    paused = time.monotonic()
    b = await start_app(ports, body(server.url), ready=False)
    async with asyncio.timeout(10):
        while not b.ready():
            await asyncio.sleep(0.001)
    assert time.monotonic() - paused >= 0.9
    # the first moment it reports ready, it already routes by what A learned
    assert b.sync.bootstrapped
    assert b.plugin(PRODUCER).index.size == a.plugin(PRODUCER).index.size == 200


async def test_redis_down_at_start_delays_readiness_boundedly_then_catches_up(
    start_app, redis_server
) -> None:
    port = free_port()
    started = time.monotonic()
    url = f"redis://127.0.0.1:{port}"
    b = await start_app([free_port()], body(url, bootstrap="1s"), ready=False)
    await asyncio.sleep(0.5)
    assert not b.ready()
    await b.wait_ready(30)  # bounded by the 1 s bootstrap, not by Redis coming back
    assert time.monotonic() - started > 0.9
    assert not b.sync.bootstrapped
    text = await metrics_text(b)
    assert 'llm_d_epp_state_sync_errors_total{operation="replay"}' in text
    server = redis_server(port=port)
    server.client().xadd("epp:default/default:facts", {"o": "peer", "f": b"\x81\xa1x\x90"})
    await wait_for(lambda: b.sync.bootstrapped, 5)
