"""The data layer (llm-d's ``framework/interface/datalayer``): ``Discovery`` owns the
endpoint set; a ``DataSource`` is polled per endpoint and its ``Extractor`` turns the payload
into ``Metrics``; an ``EndpointSource`` hears endpoints join, change and leave
(``EndpointEvent``) and passes the events to its ``EndpointExtractor``s.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from epp.plugin.types import (
    Endpoint,
    Metrics,
    TypedName,
)


@runtime_checkable
class DataSource(Protocol):
    """Polled per endpoint by the collector; returns the raw payload (e.g. /metrics text).
    Capabilities: ``PollInterval`` (poll less often), ``EndpointForgetter`` (drop state of an
    endpoint that left)."""

    typed_name: TypedName

    async def poll(self, endpoint: Endpoint) -> bytes: ...


@runtime_checkable
class Extractor(Protocol):
    """Turns a source payload into updated ``Metrics`` for one endpoint (pure). ``now`` is the
    scrape time to stamp as ``update_time`` when a value changed."""

    typed_name: TypedName

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics: ...


class EndpointEventType(enum.Enum):
    """What happened to an endpoint (upstream's ``EventAddOrUpdate`` / ``EventDelete``)."""

    ADD_OR_UPDATE = "add-or-update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """An endpoint joined the pool or changed (address, port, labels; not metrics), or left it.
    A changed address is delivered as ``DELETE`` of the old endpoint then ``ADD_OR_UPDATE``."""

    type: EndpointEventType
    endpoint: Endpoint


@runtime_checkable
class EndpointSource(Protocol):
    """A ``dataLayer.sources`` entry driven by endpoint lifecycle changes instead of polling
    (``endpoint-notification-source``). The collector calls ``notify_endpoint`` once per event
    and passes what it returns to the source's extractors (``None`` = drop the event). Those
    extractors must be ``EndpointExtractor``s; the loader checks it."""

    typed_name: TypedName

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None: ...


@runtime_checkable
class EndpointExtractor(Protocol):
    """Hears endpoint lifecycle events from the ``EndpointSource`` it is listed under (upstream's
    ``EndpointExtractor``): e.g. subscribe to a pod's KV events when it is added, drop its state
    when it is removed. Called on the event loop, synchronously, as the collector sees the change:
    it must return quickly and never block (schedule I/O on the plugin's own task). An exception
    is logged and counted; other extractors still hear the event.

    It may return attributes to publish on the endpoint (keys as in ``Metrics.attributes``, e.g.
    ``topology-extractor``'s topology from the pod's labels): the collector keeps them for as
    long as the endpoint stays and merges them into its metrics whenever it has any.
    """

    typed_name: TypedName

    def extract_endpoint(self, event: EndpointEvent) -> Mapping[str, Any] | None: ...


@runtime_checkable
class Discovery(Protocol):
    """Owns the endpoint set. ``run`` calls ``publish`` with the full set whenever it changes and
    returns only when cancelled."""

    typed_name: TypedName

    async def run(self, publish: Callable[[Sequence[Endpoint]], None]) -> None: ...
