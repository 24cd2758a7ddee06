"""The pool gauges: ready endpoints, mean and standard deviation of KV-cache use, queue and
running requests, and each endpoint's queue (labelled with the endpoint's name, as upstream),
refreshed every ``--refresh-prometheus-metrics-interval``.

An endpoint counts as ready while its metrics are younger than ``--metrics-staleness-threshold``;
the means and deviations are over those endpoints only (rounded to 2 decimals, as upstream).
"""

from __future__ import annotations

import asyncio
import math
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
    key = (pool,)
    m.ready_endpoints.set(key, key, len(fresh))
    if fresh:
        kv = _summary([x.kv_cache_usage_percent for x in fresh])
        queue = _summary([float(x.waiting_queue_size) for x in fresh])
        running = _summary([float(x.running_requests_size) for x in fresh])
        m.avg_kv.set(key, key, kv[0])
        m.avg_queue.set(key, key, queue[0])
        m.avg_running.set(key, key, running[0])
        m.std_kv.labels(pool).set(kv[1])
        m.std_queue.labels(pool).set(queue[1])
        m.std_running.labels(pool).set(running[1])
    m.per_endpoint_queue.clear()  # endpoints that left have no series, as upstream's collector
    for e in endpoints:
        if e.metrics is not None:
            m.per_endpoint_queue.set((pool, e.name), (pool, e.name), e.metrics.waiting_queue_size)


def _summary(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1, at least 1), both rounded to 2 decimals, as
    upstream's pool gauges."""
    mean = sum(values) / len(values)
    squares = sum((v - mean) ** 2 for v in values)
    return round(mean, 2), round(math.sqrt(squares / max(1, len(values) - 1)), 2)


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
