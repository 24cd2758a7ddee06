"""More requests in flight than Envoy's default circuit breakers allow (1,024 per cluster): every
request holds an ext_proc stream to the EPP, and over HTTP/1.1 a connection to its model server,
for its whole length, so a gateway left at Envoy's defaults answers 503 past 1,024 requests in
flight. The config `epp envoy-config` generates raises the limits (`--max-concurrent-requests`),
and caps the streams per connection to the EPP at the EPP's own limit, 1,000, so that Envoy
opens a second connection rather than have streams over that limit refused."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

pytestmark = [pytest.mark.envoy]

IN_FLIGHT = 1100
ACTIVE = "http.ingress.downstream_rq_active"


async def test_more_than_1024_requests_in_flight_are_all_answered(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    # Slow pods (real time, 40 tokens, batches of 256), so that all the requests overlap.
    fleet = await sim_pods(2, time_scale=1.0)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    body = {"model": "sim-model", "prompt": "count to forty", "max_tokens": 40}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> int:
            async with session.post(f"{proxy.url}/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status

        peak = 0
        tasks = [asyncio.create_task(one()) for _ in range(IN_FLIGHT)]
        deadline = time.monotonic() + 110
        while not all(t.done() for t in tasks) and time.monotonic() < deadline:
            peak = max(peak, (await asyncio.to_thread(proxy.stats)).get(ACTIVE, 0))
            await asyncio.sleep(0.1)
        statuses = await asyncio.gather(*tasks)
        stats = await asyncio.to_thread(proxy.stats)
    overflow = stats.get("cluster.epp.upstream_rq_active_overflow", 0)
    refused = stats.get("cluster.epp.http2.rx_reset", 0)
    assert peak > 1024, f"only {peak} requests were in flight at once"
    assert overflow == 0
    assert refused == 0  # no ext_proc stream over the EPP's limit of 1,000 per connection
    assert statuses.count(200) == IN_FLIGHT, {s: statuses.count(s) for s in set(statuses)}
