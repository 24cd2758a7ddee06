"""Endpoint attributes published by several sources and extractors on one endpoint survive each
other's updates, and the core metrics extractor keeps them."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from epp.datalayer.collector import Collector, SourcePipeline
from epp.datalayer.store import Datastore
from epp.plugin import Metrics, Topology, endpoint_attribute
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.params import decode
from epp.plugin.topology import topology_key
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from epp.plugins.sources.dcgm import DCGMDataSource, DCGMExtractor
from epp.plugins.sources.metrics import MetricsDataSource
from epp.plugins.sources.topology import TopologyExtractor
from tests.builders import handle
from tests.conftest import MetricsServer, ServerFactory

ENGINE = b"vllm:num_requests_waiting 3\nvllm:kv_cache_usage_perc 0.5\n"
DCGM = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",pod="pod-a"} 40\n'
LABELS = {"kubernetes.io/hostname": "node-1", "topology.kubernetes.io/zone": "z1"}
TOPOLOGY = topology_key()


def _build(cls: Any, **params: Any) -> Any:
    return cls(name="", params=decode(cls.Params, params), handle=handle())


@asynccontextmanager
async def _collecting(engine: MetricsServer, dcgm: MetricsServer) -> AsyncIterator[Datastore]:
    store = Datastore(time.monotonic)
    store.set_endpoints([dataclasses.replace(engine.endpoint("pod-a"), labels=LABELS)])
    metrics_source = _build(MetricsDataSource)
    dcgm_source = _build(DCGMDataSource, port=dcgm.port)
    collector = Collector(
        store=store,
        pipelines=[
            SourcePipeline.of(
                metrics_source, [_build(CoreMetricsExtractor), _build(TopologyExtractor)]
            ),
            SourcePipeline.of(dcgm_source, [_build(DCGMExtractor)]),
        ],
        interval=0.05,
        poll_timeout=0.5,
        clock=time.monotonic,
        on_poll_error=lambda *_: None,
        on_extract_error=lambda *_: None,
    )
    task = asyncio.create_task(collector.run())
    try:
        yield store
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await metrics_source.stop()
        await dcgm_source.stop()


async def _until(store: Datastore, condition: Callable[[Metrics], bool]) -> Metrics:
    async with asyncio.timeout(3.0):
        while True:
            endpoint = store.get("default/pod-a")
            metrics = None if endpoint is None else endpoint.metrics
            if metrics is not None and condition(metrics):
                return metrics
            await asyncio.sleep(0.01)


def _gpu(m: Metrics) -> object:
    return m.attributes.get(GPU_UTILIZATION)


async def test_attributes_of_two_sources_survive_each_others_updates(
    metrics_server: ServerFactory,
) -> None:
    engine = await metrics_server(payload=ENGINE)
    dcgm = await metrics_server(payload=DCGM)
    async with _collecting(engine, dcgm) as store:
        first = await _until(store, lambda m: _gpu(m) == 0.4 and m.waiting_queue_size == 3)
        assert first.attributes[TOPOLOGY] == Topology(hostname="node-1", zone="z1")

        engine.payload = ENGINE.replace(b"waiting 3", b"waiting 7")
        after_core = await _until(store, lambda m: m.waiting_queue_size == 7)
        assert _gpu(after_core) == 0.4
        assert after_core.attributes[TOPOLOGY] == Topology(hostname="node-1", zone="z1")

        dcgm.payload = DCGM.replace(b"} 40", b"} 90")
        after_dcgm = await _until(store, lambda m: _gpu(m) == 0.9)
        assert after_dcgm.waiting_queue_size == 7
        assert TOPOLOGY in after_dcgm.attributes
        endpoint = store.get("default/pod-a")
        assert endpoint is not None
        assert endpoint_attribute(endpoint, GPU_UTILIZATION) == 0.9


async def test_gpu_updates_do_not_refresh_update_time_of_a_failing_model_server(
    metrics_server: ServerFactory,
) -> None:
    engine = await metrics_server(payload=ENGINE)
    dcgm = await metrics_server(payload=DCGM)
    async with _collecting(engine, dcgm) as store:
        scraped = await _until(store, lambda m: _gpu(m) == 0.4 and m.update_time > 0)
        engine.status = 500  # the model server's metrics stop; the exporter goes on
        await asyncio.sleep(0.1)
        stamped = await _until(store, lambda m: True)
        dcgm.payload = DCGM.replace(b"} 40", b"} 70")
        later = await _until(store, lambda m: _gpu(m) == 0.7)
        assert later.update_time == stamped.update_time >= scraped.update_time


async def test_attributes_an_endpoint_extractor_publishes_reach_the_scraped_metrics(
    metrics_server: ServerFactory,
) -> None:
    """``topology-extractor`` under the notification source (where upstream attaches it): the
    topology it publishes when the endpoint joins is merged into every later scrape."""
    from epp.datalayer.collector import NotificationPipeline
    from epp.plugins.sources.notification import EndpointNotificationSource

    engine = await metrics_server(payload=ENGINE)
    store = Datastore(time.monotonic)
    metrics_source = _build(MetricsDataSource)
    collector = Collector(
        store=store,
        pipelines=[
            SourcePipeline.of(metrics_source, [_build(CoreMetricsExtractor)]),
            NotificationPipeline(_build(EndpointNotificationSource), (_build(TopologyExtractor),)),
        ],
        interval=0.05,
        poll_timeout=0.5,
        clock=time.monotonic,
        on_poll_error=lambda *_: None,
        on_extract_error=lambda *_: None,
    )
    task = asyncio.create_task(collector.run())
    try:
        await asyncio.sleep(0)
        store.set_endpoints([dataclasses.replace(engine.endpoint("pod-a"), labels=LABELS)])
        metrics = await _until(store, lambda m: m.waiting_queue_size == 3)
        assert metrics.attributes.get(TOPOLOGY) == Topology(hostname="node-1", zone="z1")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await metrics_source.stop()
