"""``precise-prefix-cache-producer`` following the pool by endpoint notifications (with the 0.5 s
poll as fallback), its index metrics and their periodic log, and silent publishers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from epp.plugin import (
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    PrefixMatchInfo,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.prefix import pack_token_ids
from epp.plugins.producers.precise_prefix import producer as producer_module
from epp.plugins.producers.precise_prefix.events import BlockRemoved, BlockStored, EventBatch
from epp.plugins.producers.precise_prefix.instrumented import InstrumentedIndex
from epp.plugins.producers.precise_prefix.pool import SILENT_AFTER, PublisherWatch
from epp.plugins.producers.precise_prefix.producer import PrecisePrefixCacheProducer
from epp_tools.stack.envoy import free_port
from tests.builders import FakeHandle, make_endpoint, make_request

ADD, DELETE = EndpointEventType.ADD_OR_UPDATE, EndpointEventType.DELETE
TOKENS_KEY = "TokenizedPrompt/token-producer"
KEY = "PrefixCacheMatchInfo/precise-prefix-cache-producer"
POOL = [make_endpoint(i, address="127.0.0.1", port=8000 + i) for i in range(3)]


class PoolHandle(FakeHandle):
    """A handle whose pool the test sets."""

    pool: tuple[Any, ...] = ()

    def endpoints(self) -> tuple[Any, ...]:
        return self.pool


def make(h: FakeHandle | None = None, **params: Any) -> PrecisePrefixCacheProducer:
    params.setdefault("tokenProcessorConfig", {"blockSizeTokens": 4, "hashAlgorithm": "xxh64"})
    params.setdefault("kvEventsConfig", {"podDiscoveryConfig": {"socketPort": free_port()}})
    decoded = decode(PrecisePrefixCacheProducer.Params, params)
    return PrecisePrefixCacheProducer(name="", params=decoded, handle=h or PoolHandle())


def feed(p: PrecisePrefixCacheProducer, endpoint: str, tokens: list[int], first: int = 1) -> None:
    hashes = tuple(range(first, first + len(tokens) // 4))
    event = BlockStored(hashes, None, pack_token_ids(tokens), 4)
    p.handle_batch(EventBatch(endpoint, "m", 0, 0.0, 0, (event,)))


@pytest.fixture
async def started() -> AsyncIterator[Callable[..., Any]]:
    running: list[PrecisePrefixCacheProducer] = []

    async def start(p: PrecisePrefixCacheProducer) -> PrecisePrefixCacheProducer:
        await p.start()
        running.append(p)
        return p

    yield start
    for p in running:
        await p.stop()


async def _until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


# ---- notifications ------------------------------------------------------------------------------


async def test_notified_endpoints_are_subscribed_and_removed_ones_forgotten(started: Any) -> None:
    h = PoolHandle()
    p = await started(make(h))
    assert isinstance(p, EndpointExtractor)
    assert p.hub is not None and p.hub.targets() == {}
    for ep in POOL:
        p.extract_endpoint(EndpointEvent(ADD, ep))
    await asyncio.sleep(0)  # the burst is applied once, on the next loop iteration
    assert set(p.hub.targets()) == {ep.id for ep in POOL}
    feed(p, POOL[0].id, list(range(8)))
    p.extract_endpoint(EndpointEvent(DELETE, POOL[0]))
    assert POOL[0].id not in p.index.block_counts()  # cleared at once
    await asyncio.sleep(0)
    assert set(p.hub.targets()) == {POOL[1].id, POOL[2].id}
    assert p.dump_state()["subscriptions"]["pool"] == "notified"


async def test_notified_pool_is_not_replaced_by_polling(
    started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_module, "REFRESH_INTERVAL", 0.02)
    h = PoolHandle()
    h.pool = tuple(POOL)  # what polling would see
    p = await started(make(h))
    assert p.hub is not None
    await _until(lambda: len(p.hub.targets()) == 3)  # polled until the first notification
    p.extract_endpoint(EndpointEvent(ADD, POOL[1]))
    await asyncio.sleep(0.1)  # several housekeeping ticks
    assert set(p.hub.targets()) == {POOL[1].id}


async def test_pool_is_polled_when_no_notification_source_is_wired(
    started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_module, "REFRESH_INTERVAL", 0.02)
    h = PoolHandle()
    p = await started(make(h))
    assert p.hub is not None
    h.pool = tuple(POOL[:2])
    await _until(lambda: set(p.hub.targets()) == {POOL[0].id, POOL[1].id})
    feed(p, POOL[1].id, list(range(4)))
    h.pool = (POOL[0],)
    await _until(lambda: set(p.hub.targets()) == {POOL[0].id})
    assert p.index.block_counts() == {}
    assert p.dump_state()["subscriptions"]["pool"] == "polled"


def test_a_burst_of_events_costs_one_reconciliation_when_a_loop_runs() -> None:
    async def scenario() -> int:
        p = make()
        calls = []
        p.membership._apply = lambda: calls.append(1)  # type: ignore[method-assign]
        for ep in POOL:
            p.extract_endpoint(EndpointEvent(ADD, ep))
        await asyncio.sleep(0)
        return len(calls)

    assert asyncio.run(scenario()) == 1


def test_events_without_a_running_loop_apply_at_once() -> None:
    p = make()
    p.extract_endpoint(EndpointEvent(ADD, POOL[0]))
    assert p.resolve("pod-0", None) == POOL[0].id  # the pod map follows the notified pool


# ---- index metrics and the metrics beat ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(60_000_000_000, 60.0), ("1m", 60.0), ("250ms", 0.25), (0, 0.0)],
)
def test_metrics_logging_interval_takes_nanoseconds_or_a_duration(
    value: Any, seconds: float
) -> None:
    params = decode(
        PrecisePrefixCacheProducer.Params,
        {"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": value}}},
    )
    assert params.indexer_config.kv_block_index_config.metrics_logging_seconds == seconds


def test_metrics_logging_interval_rejects_what_is_no_duration() -> None:
    for value in ("soon", 1.5, True):
        with pytest.raises(ParamError, match="metricsLoggingInterval"):
            decode(
                PrecisePrefixCacheProducer.Params,
                {"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": value}}},
            )


def test_enable_metrics_counts_admissions_evictions_and_lookups() -> None:
    h = PoolHandle()
    p = make(h, indexerConfig={"kvBlockIndexConfig": {"enableMetrics": True}})
    assert isinstance(p.index, InstrumentedIndex)
    feed(p, POOL[0].id, list(range(12)))  # 3 blocks
    removed = BlockRemoved((3,))  # the last block goes
    p.handle_batch(EventBatch(POOL[0].id, "m", 1, 0.0, 0, (removed,)))
    prompt = TokenizedPrompt.from_token_ids([list(range(16))])
    p.compute(make_request(target_model="m", attributes={TOKENS_KEY: prompt}), POOL)
    beat = p.index.counters.beat()
    assert (beat["admissions"], beat["evictions"], beat["lookups"], beat["hits"]) == (3, 1, 1, 2)
    sample = h.registry.get_sample_value
    labels = {"plugin_name": p.TYPE}
    for name in ("llm_d_epp_kv_cache_index_admissions_total", "kvcache_index_admissions_total"):
        assert sample(name, labels) == 3
    assert sample("llm_d_epp_kv_cache_index_max_pod_hit_count_total", labels) == 2
    assert sample("llm_d_epp_kv_cache_index_lookup_latency_seconds_count", labels) == 1
    assert p.dump_state()["indexMetrics"]["admissions"] == 3


def test_index_is_plain_when_metrics_are_off() -> None:
    p = make()
    assert not isinstance(p.index, InstrumentedIndex)
    assert p.dump_state()["indexMetrics"] == {}


async def test_metrics_beat_is_logged_every_interval_when_enabled(
    started: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(producer_module, "MIN_BEAT_INTERVAL", 0.01)
    cfg = {"kvBlockIndexConfig": {"enableMetrics": True, "metricsLoggingInterval": 20_000_000}}
    p = make(indexerConfig=cfg)
    feed(p, POOL[0].id, list(range(8)))
    with caplog.at_level(logging.INFO):
        await started(p)
        await _until(lambda: sum("metrics beat" in r.getMessage() for r in caplog.records) >= 2)
    beat = next(r.getMessage() for r in caplog.records if "metrics beat" in r.getMessage())
    assert "admissions=2" in beat and "latency_avg=" in beat


async def test_metrics_beat_interval_has_a_floor_of_one_second(
    started: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = {"kvBlockIndexConfig": {"enableMetrics": True, "metricsLoggingInterval": 1}}  # 1 ns
    with caplog.at_level(logging.INFO):
        p = await started(make(indexerConfig=cfg))
        await asyncio.sleep(0.1)
    assert len(p._tasks) == 2 and not p._tasks[1].done()
    assert not any("metrics beat" in r.getMessage() for r in caplog.records)


async def test_metrics_logging_interval_is_ignored_with_a_warning_without_enable_metrics(
    started: Any, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = {"kvBlockIndexConfig": {"enableMetrics": False, "metricsLoggingInterval": "10ms"}}
    with caplog.at_level(logging.INFO):
        p = await started(make(indexerConfig=cfg))
        await asyncio.sleep(0.05)
    messages = [r.getMessage() for r in caplog.records]
    assert any("has no effect without enableMetrics" in m for m in messages)
    assert not any("metrics beat" in m for m in messages)
    assert len(p._tasks) == 1


# ---- silent publishers -------------------------------------------------------------------


def test_silent_publishers_are_reported_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    h = FakeHandle()
    watch = PublisherWatch(h.registry, "pp", logging.getLogger("test.watch"))
    targets = {ep.id: f"tcp://127.0.0.1:{5557 + i}" for i, ep in enumerate(POOL)}
    with caplog.at_level(logging.WARNING, logger="test.watch"):
        assert watch.check(targets, 0.0) == ()
        watch.heard(POOL[1].id)
        silent = watch.check(targets, SILENT_AFTER)
        watch.check(targets, SILENT_AFTER + 10)
    assert silent == (POOL[0].id, POOL[2].id)
    [record] = caplog.records
    assert "no KV events from default/pod-0-rank-0 (tcp://127.0.0.1:5557)" in record.getMessage()
    sample = h.registry.get_sample_value
    assert sample("llm_d_epp_precise_prefix_silent_publishers", {"plugin_name": "pp"}) == 2
    assert sample("llm_d_epp_kv_cache_events_active_subscribers", {"plugin_name": "pp"}) == 3
    assert watch.check({POOL[1].id: targets[POOL[1].id]}, SILENT_AFTER + 20) == ()


def test_bound_socket_with_nothing_received_is_reported() -> None:
    watch = PublisherWatch(FakeHandle().registry, "pp", logging.getLogger("test.watch"))
    watch.central_bound(0.0)
    assert watch.check({}, SILENT_AFTER, nothing_received=True) == ("central",)
    assert watch.check({}, SILENT_AFTER, nothing_received=False) == ()


async def test_producer_routes_with_zero_matches_when_publishers_are_absent(started: Any) -> None:
    p = await started(make())
    for ep in POOL:
        p.extract_endpoint(EndpointEvent(ADD, ep))
    prompt = TokenizedPrompt.from_token_ids([list(range(16))])
    req = make_request(target_model="m", attributes={TOKENS_KEY: prompt})
    await p.produce(req, POOL)
    assert set(req.attributes[KEY].values()) == {PrefixMatchInfo(0, 4, 4)}
