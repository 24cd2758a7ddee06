"""The collector delivers endpoint lifecycle events to notification sources' extractors."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from epp.datalayer.collector import Collector, NotificationPipeline
from epp.datalayer.store import Datastore
from epp.plugin import EndpointEvent, EndpointEventType, NoParams, TypedName
from epp.plugins.sources.notification import EndpointNotificationSource
from tests.builders import handle, make_endpoint

ADD, DELETE = EndpointEventType.ADD_OR_UPDATE, EndpointEventType.DELETE


class _Recorder:
    """An extractor that records what it hears (optionally failing)."""

    def __init__(self, name: str = "rec", fail: bool = False) -> None:
        self.typed_name = TypedName("recorder", name)
        self.events: list[tuple[EndpointEventType, str, str]] = []
        self.fail = fail

    def extract_endpoint(self, event: EndpointEvent) -> None:
        self.events.append((event.type, event.endpoint.id, event.endpoint.address))
        if self.fail:
            raise RuntimeError("boom")


class _Dropping(EndpointNotificationSource):
    """A source that filters out deletes (``None`` = not passed on)."""

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None:
        return None if event.type is DELETE else event


def _source(cls: type[EndpointNotificationSource] = EndpointNotificationSource) -> Any:
    return cls(name="", params=NoParams(), handle=handle())


@asynccontextmanager
async def _running(
    store: Datastore, *pipelines: NotificationPipeline, errors: list[Any] | None = None
) -> AsyncIterator[Collector]:
    collector = Collector(
        store=store,
        pipelines=list(pipelines),
        interval=0.05,
        clock=time.monotonic,
        on_poll_error=lambda *a: None,
        on_extract_error=lambda *a: (errors if errors is not None else []).append(a),
    )
    task = asyncio.create_task(collector.run())
    await asyncio.sleep(0)
    try:
        yield collector
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_extractors_hear_adds_and_removes_when_endpoint_set_changes() -> None:
    store = Datastore(time.monotonic)
    store.set_endpoints([make_endpoint(0), make_endpoint(1)])
    rec = _Recorder()
    source = _source()
    async with _running(store, NotificationPipeline(source, [rec])):
        assert sorted(rec.events) == [
            (ADD, "default/pod-0-rank-0", "192.168.1.1"),
            (ADD, "default/pod-1-rank-0", "192.168.1.2"),
        ]
        store.set_endpoints([make_endpoint(1), make_endpoint(2)])
        assert rec.events[2:] == [
            (DELETE, "default/pod-0-rank-0", "192.168.1.1"),
            (ADD, "default/pod-2-rank-0", "192.168.1.3"),
        ]
    assert source.dump_state() == {"events": {"add-or-update": 3, "delete": 1}}


async def test_extractors_hear_delete_then_add_when_endpoint_address_changes() -> None:
    store = Datastore(time.monotonic)
    store.set_endpoints([make_endpoint(0)])
    rec = _Recorder()
    async with _running(store, NotificationPipeline(_source(), [rec])):
        store.set_endpoints([make_endpoint(0, address="10.0.0.9")])
        await _until(lambda: len(rec.events) >= 3)
    assert rec.events == [
        (ADD, "default/pod-0-rank-0", "192.168.1.1"),
        (DELETE, "default/pod-0-rank-0", "192.168.1.1"),
        (ADD, "default/pod-0-rank-0", "10.0.0.9"),
    ]


async def test_extractors_hear_update_on_label_change_but_not_on_metric_updates() -> None:
    store = Datastore(time.monotonic)
    ep = make_endpoint(0)
    store.set_endpoints([ep])
    rec = _Recorder()
    async with _running(store, NotificationPipeline(_source(), [rec])):
        for q in range(5):
            assert ep.metrics is not None
            store.update_metrics(ep.id, dataclasses.replace(ep.metrics, waiting_queue_size=q))
            await asyncio.sleep(0.06)
        assert len(rec.events) == 1
        store.set_endpoints([make_endpoint(0, labels={"llm-d.ai/role": "decode"})])
        await _until(lambda: len(rec.events) >= 2)
    assert rec.events[1] == (ADD, "default/pod-0-rank-0", "192.168.1.1")


async def test_failing_extractor_is_counted_and_others_still_hear_events() -> None:
    store = Datastore(time.monotonic)
    store.set_endpoints([make_endpoint(0)])
    bad, good, errors = _Recorder("bad", fail=True), _Recorder("good"), []
    async with _running(store, NotificationPipeline(_source(), [bad, good]), errors=errors):
        store.set_endpoints([])
    assert len(good.events) == len(bad.events) == 2
    assert [(src, ext) for src, ext, _ in errors] == [
        ("endpoint-notification-source", "recorder")
    ] * 2


async def test_source_returning_none_drops_the_event() -> None:
    store = Datastore(time.monotonic)
    store.set_endpoints([make_endpoint(0)])
    rec = _Recorder()
    async with _running(store, NotificationPipeline(_source(_Dropping), [rec])):
        store.set_endpoints([])
    assert [e[0] for e in rec.events] == [ADD]
