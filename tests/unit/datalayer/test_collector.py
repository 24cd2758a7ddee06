from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from epp.datalayer.collector import Collector, SourcePipeline
from epp.datalayer.store import Datastore
from epp.plugin import Endpoint, Metrics
from epp.plugin.params import decode
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from epp.plugins.sources.metrics import MetricsDataSource
from tests.builders import handle
from tests.conftest import ServerFactory

PAYLOAD = b"vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n"
INTERVAL = 0.05


class _Errors:
    """Records the collector's error callbacks."""

    def __init__(self) -> None:
        self.polls: list[tuple[str, str, Exception]] = []
        self.extracts: list[tuple[str, str, Exception]] = []

    def on_poll(self, source_type: str, endpoint_id: str, exc: Exception) -> None:
        self.polls.append((source_type, endpoint_id, exc))

    def on_extract(self, source_type: str, extractor_type: str, exc: Exception) -> None:
        self.extracts.append((source_type, extractor_type, exc))


def _source(**params: Any) -> MetricsDataSource:
    decoded = decode(MetricsDataSource.Params, params)
    return MetricsDataSource(name="", params=decoded, handle=handle())


def _extractor() -> CoreMetricsExtractor:
    params = decode(CoreMetricsExtractor.Params, {})
    return CoreMetricsExtractor(name="", params=params, handle=handle())


@asynccontextmanager
async def _running(
    store: Datastore,
    errors: _Errors,
    *,
    source: MetricsDataSource | None = None,
    poll_timeout: float = 0.3,
    **kwargs: Any,
) -> AsyncIterator[Collector]:
    source = source or _source()
    collector = Collector(
        store=store,
        pipelines=[SourcePipeline.of(source, [_extractor()])],
        interval=INTERVAL,
        poll_timeout=poll_timeout,
        clock=time.monotonic,
        on_poll_error=errors.on_poll,
        on_extract_error=errors.on_extract,
        **kwargs,
    )
    task = asyncio.create_task(collector.run())
    try:
        yield collector
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await source.stop()


async def _until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


def _metrics(store: Datastore, endpoint_id: str) -> Metrics | None:
    endpoint = store.get(endpoint_id)
    return None if endpoint is None else endpoint.metrics


async def test_collector_updates_healthy_endpoint_when_others_stall_or_fail(
    metrics_server: ServerFactory,
) -> None:
    healthy = await metrics_server(payload=PAYLOAD)
    stalled = await metrics_server(payload=PAYLOAD, stall=True)
    failing = await metrics_server(payload=b"oops", status=500)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([healthy.endpoint("ok"), stalled.endpoint("hung"), failing.endpoint("bad")])
    async with _running(store, errors, poll_timeout=0.3):
        await _until(lambda: len(healthy.arrivals) >= 12)
        await _until(lambda: any(e[1] == "default/hung" for e in errors.polls))
    metrics = _metrics(store, "default/ok")
    assert metrics is not None
    assert (metrics.waiting_queue_size, metrics.kv_cache_usage_percent) == (3, 0.5)
    assert _metrics(store, "default/hung") is None
    assert _metrics(store, "default/bad") is None
    hung = [exc for _, ep, exc in errors.polls if ep == "default/hung"]
    bad = [exc for _, ep, exc in errors.polls if ep == "default/bad"]
    assert hung and all(isinstance(exc, TimeoutError) for exc in hung)
    assert bad and all("HTTP 500" in str(exc) for exc in bad)
    assert {source for source, _, _ in errors.polls} == {"metrics-data-source"}
    assert not any(ep == "default/ok" for _, ep, _ in errors.polls)
    assert errors.extracts == []


async def test_collector_reports_extract_error_when_payload_has_no_metrics(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=b"unrelated_metric 1\n")
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([server.endpoint("a")])
    async with _running(store, errors):
        await _until(lambda: len(errors.extracts) >= 2)
    source_type, extractor_type, exc = errors.extracts[0]
    assert (source_type, extractor_type) == ("metrics-data-source", "core-metrics-extractor")
    assert isinstance(exc, ValueError)
    assert _metrics(store, "default/a") is None


async def test_collector_keeps_update_time_moving_when_scrapes_succeed(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAYLOAD)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([server.endpoint("a")])
    seen: set[float] = set()

    def record() -> bool:
        metrics = _metrics(store, "default/a")
        if metrics is not None:
            seen.add(metrics.update_time)
        return len(seen) >= 4

    async with _running(store, errors):
        await _until(record)
    assert len(seen) >= 4


async def test_collector_follows_endpoint_set_when_store_changes(
    metrics_server: ServerFactory,
) -> None:
    first = await metrics_server(payload=PAYLOAD)
    second = await metrics_server(payload=PAYLOAD)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([first.endpoint("a")])
    async with _running(store, errors) as collector:
        await _until(lambda: collector.active_endpoints() == {"default/a"})
        store.set_endpoints([second.endpoint("b")])
        assert collector.active_endpoints() == {"default/b"}
        await _until(lambda: len(second.arrivals) >= 2)
        hits_after_removal = len(first.arrivals)
        await asyncio.sleep(4 * INTERVAL)
        assert len(first.arrivals) == hits_after_removal
    assert collector.active_endpoints() == frozenset()


async def test_first_cycle_done_becomes_true_when_every_endpoint_was_polled(
    metrics_server: ServerFactory,
) -> None:
    healthy = await metrics_server(payload=PAYLOAD)
    failing = await metrics_server(status=500)
    store, errors = Datastore(time.monotonic), _Errors()
    async with _running(store, errors) as collector:
        assert collector.first_cycle_done() is False
        store.set_endpoints([healthy.endpoint("a"), failing.endpoint("b")])
        collector.discovery_synced()
        await _until(collector.first_cycle_done)
        assert errors.polls  # the failing endpoint's attempt counts as an attempt
        store.set_endpoints([healthy.endpoint("a"), healthy.endpoint("c")])
        assert collector.first_cycle_done() is True


@pytest.mark.parametrize(
    ("synced", "expected"),
    [pytest.param(False, False, id="not-synced"), pytest.param(True, True, id="synced")],
)
async def test_first_cycle_done_follows_discovery_when_endpoint_set_is_empty(
    synced: bool, expected: bool
) -> None:
    store, errors = Datastore(time.monotonic), _Errors()
    async with _running(store, errors) as collector:
        if synced:
            collector.discovery_synced()
        assert collector.first_cycle_done() is expected


async def test_collector_skips_missed_ticks_when_a_poll_runs_late(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAYLOAD, delays=[0.0, 6 * INTERVAL])
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([server.endpoint("a")])
    async with _running(store, errors, poll_timeout=1.0):
        await _until(lambda: len(server.arrivals) >= 6)
    gaps = [b - a for a, b in zip(server.arrivals[2:], server.arrivals[3:], strict=False)]
    # A catch-up burst would fire the six missed ticks back to back.
    assert min(gaps) > INTERVAL / 2


async def test_collector_polls_source_less_often_when_source_interval_is_longer(
    metrics_server: ServerFactory,
) -> None:
    every_tick = await metrics_server(payload=PAYLOAD)
    slow = await metrics_server(payload=PAYLOAD)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([every_tick.endpoint("fast")])
    async with _running(store, errors):
        await _until(lambda: len(every_tick.arrivals) >= 9)
    store2 = Datastore(time.monotonic)
    store2.set_endpoints([slow.endpoint("slow")])
    async with _running(store2, errors, source=_source(interval="200ms")):
        await asyncio.sleep(9 * INTERVAL)
    assert 1 <= len(slow.arrivals) <= 4


def test_collector_clamps_interval_when_below_fifty_milliseconds() -> None:
    errors = _Errors()
    collector = Collector(
        store=Datastore(time.monotonic),
        pipelines=[],
        interval=0.001,
        clock=time.monotonic,
        on_poll_error=errors.on_poll,
        on_extract_error=errors.on_extract,
    )
    assert collector.interval == 0.05


async def test_collector_logs_errors_once_per_window_when_endpoint_keeps_failing(
    metrics_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    failing = await metrics_server(status=500)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([failing.endpoint("bad")])
    logger = logging.getLogger("test.collector")
    with caplog.at_level(logging.WARNING, logger="test.collector"):
        async with _running(store, errors, logger=logger, error_log_interval=60.0):
            await _until(lambda: len(errors.polls) >= 5)
    assert len([r for r in caplog.records if getattr(r, "endpoint", "") == "default/bad"]) == 1


async def test_collector_never_stores_metrics_when_endpoint_was_removed_mid_poll(
    metrics_server: ServerFactory,
) -> None:
    slow = await metrics_server(payload=PAYLOAD, delays=[0.2])
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([slow.endpoint("a")])
    async with _running(store, errors, poll_timeout=1.0):
        await _until(lambda: len(slow.arrivals) >= 1)
        store.set_endpoints([])
        await asyncio.sleep(0.3)
    assert store.snapshot() == ()
    assert errors.polls == []


class _ForgetfulSource(MetricsDataSource):
    """The real metrics source, recording the endpoints it is told to forget."""

    def __init__(self) -> None:
        super().__init__(name="", params=MetricsDataSource.Params(), handle=handle())
        self.forgotten: list[str] = []

    def forget(self, endpoint: Endpoint) -> None:
        self.forgotten.append(endpoint.hostport)
        super().forget(endpoint)


async def test_collector_tells_sources_to_forget_when_endpoint_leaves_or_moves(
    metrics_server: ServerFactory,
) -> None:
    first, second, moved = [await metrics_server(payload=PAYLOAD) for _ in range(3)]
    store, errors = Datastore(time.monotonic), _Errors()
    source = _ForgetfulSource()
    store.set_endpoints([first.endpoint("a"), second.endpoint("b")])
    async with _running(store, errors, source=source):
        await _until(lambda: len(first.arrivals) >= 1 and len(second.arrivals) >= 1)
        store.set_endpoints([second.endpoint("b")])
        assert source.forgotten == [first.endpoint("a").hostport]
        store.set_endpoints([moved.endpoint("b")])  # same pod id, new address
        await _until(lambda: len(moved.arrivals) >= 1)
    assert source.forgotten == [first.endpoint("a").hostport, second.endpoint("b").hostport]


async def test_endpoint_leaves_routing_in_the_scrape_after_its_server_dies_and_others_stay(
    metrics_server: ServerFactory,
) -> None:
    alive = await metrics_server(payload=PAYLOAD)
    doomed = await metrics_server(payload=PAYLOAD)
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([alive.endpoint("alive"), doomed.endpoint("doomed")])
    async with _running(store, errors):
        await _until(lambda: len(doomed.arrivals) >= 3)
        assert [e.id for e in store.routable()] == ["default/alive", "default/doomed"]
        await doomed.close()
        await _until(lambda: "default/doomed" in store.down)
        assert [e.id for e in store.routable()] == ["default/alive"]
        assert len(store.snapshot()) == 2
    first = next(exc for _, ep, exc in errors.polls if ep == "default/doomed")
    # the kept-alive connection the dead server dropped is retried at once: the first error the
    # collector sees is the refused reconnect, not "connection closed"
    assert isinstance(first, ConnectionRefusedError)


async def test_refused_scrape_on_another_port_does_not_take_the_endpoint_out(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAYLOAD)
    await server.close()
    store, errors = Datastore(time.monotonic), _Errors()
    store.set_endpoints([server.endpoint("a")])
    async with _running(store, errors, source=_source(port=server.port)):
        await _until(lambda: len(errors.polls) >= 2)
    assert isinstance(errors.polls[0][2], ConnectionRefusedError)
    assert store.down == frozenset()
