"""The pool gauges: ready endpoints, mean KV-cache use, queue and running requests, and each
endpoint's queue, refreshed every ``--refresh-prometheus-metrics-interval``.

An endpoint counts as ready while its metrics are younger than ``--metrics-staleness-threshold``;
the means are over those endpoints only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from epp.observability.metrics import EppMetrics
from epp.plugin import Endpoint


def refresh_pool_gauges(
    m: EppMetrics, endpoints: Sequence[Endpoint], *, pool: str, staleness: float, now: float
) -> None:
    fresh = [
        e.metrics
        for e in endpoints
        if e.metrics is not None
        and e.metrics.update_time
        and now - e.metrics.update_time <= staleness
    ]
    m.ready_endpoints.set((pool,), (pool,), len(fresh))
    if fresh:
        m.avg_kv.set((pool,), (pool,), sum(x.kv_cache_usage_percent for x in fresh) / len(fresh))
        m.avg_queue.set((pool,), (pool,), sum(x.waiting_queue_size for x in fresh) / len(fresh))
        m.avg_running.set(
            (pool,), (pool,), sum(x.running_requests_size for x in fresh) / len(fresh)
        )
    for e in endpoints:
        if e.metrics is not None:
            m.per_endpoint_queue.set(
                (pool, e.hostport), (pool, e.name), e.metrics.waiting_queue_size
            )


async def pool_gauges(
    m: EppMetrics,
    endpoints: Callable[[], Sequence[Endpoint]],
    *,
    pool: str,
    staleness: float,
    interval: float,
) -> None:
    """Refresh the gauges until cancelled."""
    while True:
        refresh_pool_gauges(m, endpoints(), pool=pool, staleness=staleness, now=time.monotonic())
        await asyncio.sleep(interval)
