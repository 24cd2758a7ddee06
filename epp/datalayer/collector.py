"""The collector: one asyncio task per endpoint polls every data source and runs its extractors.

Each tick (``interval`` seconds, at least 50 ms) an endpoint's task polls each due source with a
timeout of ``poll_timeout`` (rounded up to the next 5 ms of the loop clock: the polls timing
out together share one timer, ``epp.datalayer.timers``), feeds the payload through the source's
extractors (each gets the metrics the previous one returned) and stores the result with
``store.update_metrics``. A
``SourcePipeline`` whose ``interval`` is above zero is polled every ``round(interval /
tick)`` ticks (upstream rounds a source's ``interval`` to a multiple of the base tick).

When an endpoint leaves (or its address changes), every source that is an
``EndpointForgetter`` is told to ``forget`` it, so connections to pods that have gone close.
The same changes drive the ``NotificationPipeline``s (an ``EndpointSource`` and its
``EndpointExtractor``s, e.g. ``endpoint-notification-source``): ``ADD_OR_UPDATE`` when an id
appears in the store (delivered at once, from the store's listener), ``DELETE`` when it leaves;
an endpoint whose address or port changed is delivered as ``DELETE`` of the old one and
``ADD_OR_UPDATE`` of the new one, and one whose name, namespace, rank or labels changed as
``ADD_OR_UPDATE``, both at its next tick. Metric updates are not events.

Scheduling: an endpoint polls once when its task starts, then at the points of a monotonic grid
(``start + phase + k x interval``); a late tick skips the missed points instead of firing them in
a burst. Endpoints share ``ceil(endpoints / SLOT_SIZE)`` phases, evenly spread over the interval,
and each takes the phase its id hashes to: the endpoints of one phase wake in the same event-loop
iteration (one timer wake-up polls up to about ``SLOT_SIZE`` of them; four pods cost one wake-up
per tick, not four), while a thousand endpoints still do not all scrape in the same millisecond.
When the endpoint count crosses a multiple of ``SLOT_SIZE`` the phases are recomputed, and an
endpoint moves to its new phase at its next tick. Endpoints have separate tasks, so a hung
endpoint delays nobody else.

A poll of a ``ReachabilityProbe`` source refused by the endpoint (``ConnectionRefusedError``)
marks the endpoint down in the store (out of routing); its next successful poll marks it up.

Errors go to ``on_poll_error(source_type, endpoint_id, exc)`` /
``on_extract_error(source_type, extractor_type, exc)`` (the metrics counters) every time, and to
the log at most once per ``error_log_interval`` seconds per endpoint and source or extractor.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from epp.datalayer.store import Datastore
from epp.datalayer.timers import Deadlines, WakeGroups
from epp.plugin import (
    DataSource,
    Endpoint,
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    EndpointForgetter,
    EndpointSource,
    Extractor,
    Metrics,
    PollInterval,
    ReachabilityProbe,
)

MIN_INTERVAL: Final = 0.05
SLOT_SIZE: Final = 16
DEFAULT_ERROR_LOG_INTERVAL: Final = 30.0
_DEADLINE_QUANTUM: Final = 0.005  # polls timing out in the same 5 ms share one timer

PollErrorCallback = Callable[[str, str, Exception], None]
ExtractErrorCallback = Callable[[str, str, Exception], None]


class SourcePipeline(NamedTuple):
    """One data source, the extractors its payload goes through, its poll interval in seconds
    (0 = every tick), and whether a refused poll means the endpoint is down."""

    source: DataSource
    extractors: Sequence[Extractor]
    interval: float = 0.0
    probe: bool = False

    @classmethod
    def of(cls, source: DataSource, extractors: Sequence[Extractor]) -> SourcePipeline:
        """The pipeline of ``source``, its interval read from ``PollInterval`` and its probing
        from ``ReachabilityProbe`` if it has them."""
        interval = float(source.interval_seconds) if isinstance(source, PollInterval) else 0.0
        probe = isinstance(source, ReachabilityProbe) and bool(source.reaches_endpoint)
        return cls(source, tuple(extractors), interval, probe)


class NotificationPipeline(NamedTuple):
    """An endpoint-lifecycle source and the extractors its events go to (never polled)."""

    source: EndpointSource
    extractors: Sequence[EndpointExtractor]


DataPipeline = SourcePipeline | NotificationPipeline
"""What ``dataLayer.sources`` wires: a polled source or an endpoint-notification source."""


class Collector:
    def __init__(
        self,
        *,
        store: Datastore,
        pipelines: Sequence[DataPipeline],
        interval: float = MIN_INTERVAL,
        poll_timeout: float = 1.0,
        clock: Callable[[], float],
        on_poll_error: PollErrorCallback,
        on_extract_error: ExtractErrorCallback,
        error_log_interval: float = DEFAULT_ERROR_LOG_INTERVAL,
        logger: logging.Logger | None = None,
    ) -> None:
        self._store = store
        self._interval = max(interval, MIN_INTERVAL)
        polled = [p for p in pipelines if isinstance(p, SourcePipeline)]
        self._pipelines = tuple((p.source, tuple(p.extractors)) for p in polled)
        self._every = tuple(max(1, round(p.interval / self._interval)) for p in polled)
        self._probes = frozenset(id(p.source) for p in polled if p.probe)
        self._forgetters = tuple(
            p.source for p in polled if isinstance(p.source, EndpointForgetter)
        )
        self._notified = tuple(
            (p.source, tuple(p.extractors))
            for p in pipelines
            if isinstance(p, NotificationPipeline)
        )
        self._seen: dict[str, Endpoint] = {}
        # Attributes endpoint extractors published, per endpoint id, merged into its metrics.
        self._published: dict[str, dict[str, Any]] = {}
        self._poll_timeout = poll_timeout
        self._clock = clock
        self._on_poll_error = on_poll_error
        self._on_extract_error = on_extract_error
        self._error_log_interval = error_log_interval
        self._log = logger or logging.getLogger(__name__)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start = 0.0
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()
        self._attempted: set[str] = set()
        self._synced = False
        self._first_cycle = False
        self._last_logged: dict[tuple[str, str], float] = {}

    @property
    def interval(self) -> float:
        return self._interval

    # ---- readiness ------------------------------------------------------------------------

    def discovery_synced(self) -> None:
        """Discovery has published its first endpoint set (possibly empty)."""
        self._synced = True

    def first_cycle_done(self) -> bool:
        """True once every known endpoint had one poll attempt, or discovery published an empty
        set. Stays true afterwards: endpoints added later do not make the pool unready."""
        if not self._first_cycle:
            ids = self._store.ids()
            self._first_cycle = ids <= self._attempted if ids else self._synced
        return self._first_cycle

    # ---- task management ------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the store's endpoint set until cancelled; then stop every endpoint task."""
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._wakeups = WakeGroups(self._loop)
        self._deadlines = Deadlines(self._loop, self._poll_timeout, _DEADLINE_QUANTUM)
        self._store.add_listener(self._sync)
        try:
            self._sync(self._store.ids())
            await asyncio.Event().wait()
        finally:
            self._store.remove_listener(self._sync)
            tasks = [*self._tasks.values(), *self._stopping]
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def active_endpoints(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def _sync(self, ids: frozenset[str]) -> None:
        assert self._loop is not None, "listener registered only while run() is active"
        for endpoint_id in [i for i in self._tasks if i not in ids]:
            task = self._tasks.pop(endpoint_id)
            task.cancel()
            # Keep a reference until the cancelled task has finished unwinding.
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
            self._attempted.discard(endpoint_id)
            gone = self._seen.pop(endpoint_id, None)
            if gone is not None:
                self._forget(gone)
                self._notify(EndpointEventType.DELETE, gone)
            for key in [k for k in self._last_logged if k[0] == endpoint_id]:
                del self._last_logged[key]
        for endpoint_id in ids - self._tasks.keys():
            self._tasks[endpoint_id] = self._loop.create_task(
                self._endpoint_loop(endpoint_id), name=f"collect {endpoint_id}"
            )
            added = self._store.get(endpoint_id)
            if added is not None:
                self._seen[endpoint_id] = added
                self._notify(EndpointEventType.ADD_OR_UPDATE, added)

    async def _endpoint_loop(self, endpoint_id: str) -> None:
        loop = asyncio.get_running_loop()
        interval = self._interval
        key = zlib.crc32(endpoint_id.encode())
        tick = 0
        point: int | None = None
        while (endpoint := self._store.get(endpoint_id)) is not None:
            try:
                await self._collect(endpoint, tick)
            except Exception as exc:  # a bug must not end scraping of this endpoint
                self._log_limited(endpoint_id, "collector", "collecting failed", exc)
            self._attempted.add(endpoint_id)
            now = loop.time()
            phase = self._phase(key)
            # The first grid point after now: a late poll skips the points it missed.
            following = math.floor((now - self._start - phase) / interval) + 1
            if point is not None:
                # A timer may fire a hair before its point: never the same point twice.
                following = max(following, point + 1)
            tick += 1 if point is None else following - point
            point = following
            await self._wakeups.sleep_until(self._start + phase + following * interval)

    def _phase(self, key: int) -> float:
        """The offset in the interval of the endpoint whose id hashes to ``key``."""
        slots = max(1, -(-len(self._tasks) // SLOT_SIZE))
        return (key % slots) / slots * self._interval

    # ---- one tick ---------------------------------------------------------------------------

    async def _collect(self, endpoint: Endpoint, tick: int) -> None:
        seen = self._seen.get(endpoint.id)
        if seen is not endpoint:
            if seen is not None and (seen.address, seen.port) != (endpoint.address, endpoint.port):
                self._forget(seen)  # same pod, new address: the old one has gone
                self._notify(EndpointEventType.DELETE, seen)
                self._notify(EndpointEventType.ADD_OR_UPDATE, endpoint)
            elif seen is not None and _identity(seen) != _identity(endpoint):
                self._notify(EndpointEventType.ADD_OR_UPDATE, endpoint)
            self._seen[endpoint.id] = endpoint
        due = [
            p for p, every in zip(self._pipelines, self._every, strict=True) if tick % every == 0
        ]
        if len(due) == 1:
            await self._run_pipeline(endpoint, *due[0])
        elif due:
            await asyncio.gather(*(self._run_pipeline(endpoint, s, e) for s, e in due))

    async def _run_pipeline(
        self, endpoint: Endpoint, source: DataSource, extractors: Sequence[Extractor]
    ) -> None:
        source_type = source.typed_name.type
        task: Any = asyncio.current_task()
        deadline = self._deadlines.enter(task)
        expired = False
        try:
            try:
                payload = await source.poll(endpoint)
            finally:
                expired = self._deadlines.leave(deadline, task)
        except asyncio.CancelledError:
            if not expired or task.cancelling():
                raise
            timeout = TimeoutError(f"poll of {endpoint.id} timed out after {self._poll_timeout}s")
            self._poll_failed(source_type, endpoint.id, timeout)
            return
        except Exception as exc:
            if isinstance(exc, ConnectionRefusedError) and id(source) in self._probes:
                self._store.mark_down(endpoint.id)
            self._poll_failed(source_type, endpoint.id, exc)
            return
        if id(source) in self._probes:
            self._store.mark_up(endpoint.id)
        # Read the stored endpoint again: another source may have updated it during the poll.
        current = self._store.get(endpoint.id)
        if current is None:
            return
        previous = current.metrics or Metrics()
        metrics = previous
        now = self._clock()
        for extractor in extractors:
            try:
                metrics = extractor.extract(payload, current, metrics, now=now)
            except Exception as exc:
                self._extract_failed(source_type, extractor.typed_name.type, endpoint.id, exc)
        published = self._published.get(endpoint.id)
        if published:
            metrics = _with_attributes(metrics, published)
        if metrics is not previous:
            self._store.update_metrics(endpoint.id, metrics)

    def _forget(self, endpoint: Endpoint) -> None:
        for source in self._forgetters:
            try:
                source.forget(endpoint)
            except Exception as exc:  # a faulty source must not stop the collector
                self._log_limited(
                    endpoint.id, source.typed_name.type, "forgetting an endpoint failed", exc
                )

    def _notify(self, kind: EndpointEventType, endpoint: Endpoint) -> None:
        """Deliver one endpoint event through every notification pipeline."""
        if kind is EndpointEventType.DELETE:
            self._published.pop(endpoint.id, None)
        for source, extractors in self._notified:
            source_type = source.typed_name.type
            try:
                event = source.notify_endpoint(EndpointEvent(kind, endpoint))
            except Exception as exc:  # a faulty source must not stop the collector
                self._log_limited(
                    endpoint.id, source_type, "notifying an endpoint event failed", exc
                )
                continue
            if event is None:
                continue
            for extractor in extractors:
                try:
                    published = extractor.extract_endpoint(event)
                    if published and event.type is EndpointEventType.ADD_OR_UPDATE:
                        self._publish(event.endpoint.id, published)
                except Exception as exc:  # nor a faulty extractor
                    extractor_type = extractor.typed_name.type
                    self._on_extract_error(source_type, extractor_type, exc)
                    self._log_limited(
                        endpoint.id, extractor_type, "delivering an endpoint event failed", exc
                    )

    def _publish(self, endpoint_id: str, attributes: Mapping[str, Any]) -> None:
        """Keep an extractor's attributes for the endpoint; show them now if it has metrics."""
        self._published.setdefault(endpoint_id, {}).update(attributes)
        current = self._store.get(endpoint_id)
        if current is not None and current.metrics is not None:
            merged = _with_attributes(current.metrics, self._published[endpoint_id])
            if merged is not current.metrics:
                self._store.update_metrics(endpoint_id, merged)

    def _poll_failed(self, source_type: str, endpoint_id: str, exc: Exception) -> None:
        self._on_poll_error(source_type, endpoint_id, exc)
        self._log_limited(endpoint_id, source_type, "polling failed", exc)

    def _extract_failed(
        self, source_type: str, extractor_type: str, endpoint_id: str, exc: Exception
    ) -> None:
        self._on_extract_error(source_type, extractor_type, exc)
        self._log_limited(endpoint_id, extractor_type, "extracting metrics failed", exc)

    def _log_limited(self, endpoint_id: str, what: str, message: str, exc: Exception) -> None:
        """Log at most once per ``error_log_interval`` per (endpoint, source or extractor)."""
        now = asyncio.get_running_loop().time()
        key = (endpoint_id, what)
        last = self._last_logged.get(key)
        if last is not None and now - last < self._error_log_interval:
            return
        self._last_logged[key] = now
        self._log.warning(
            message,
            extra={
                "endpoint": endpoint_id,
                "source": what,
                "reason": str(exc) or repr(exc),
                "repeatsSuppressedFor": f"{self._error_log_interval:.0f}s",
            },
        )


def _identity(endpoint: Endpoint) -> tuple[object, ...]:
    """What a notification extractor may care about besides the address (not the metrics)."""
    return (endpoint.name, endpoint.namespace, endpoint.rank, endpoint.labels)


def _with_attributes(metrics: Metrics, attributes: Mapping[str, Any]) -> Metrics:
    """``metrics`` carrying ``attributes`` too; the same object when it already does."""
    current = metrics.attributes
    if all(key in current and current[key] == value for key, value in attributes.items()):
        return metrics
    return dataclasses.replace(metrics, attributes={**current, **attributes})
