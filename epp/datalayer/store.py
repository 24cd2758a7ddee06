"""The endpoint store: the current endpoint set and each endpoint's last scraped metrics.

Discovery replaces the whole set with ``set_endpoints``; the collector writes metrics with
``update_metrics``; the request path reads ``snapshot()``. Endpoints are frozen, so a change
creates new ``Endpoint`` objects (``dataclasses.replace``) and readers holding an older snapshot
keep a consistent view. ``snapshot()`` is called once per request: it returns a cached tuple that
is rebuilt only after a change.

``routable()`` is what requests are scheduled over: the snapshot without the endpoints the
collector found *down* (a refused connection on their serving port, ``mark_down``) until one of
their scrapes succeeds (``mark_up``); when every endpoint is down it is the whole snapshot, so
this alone never fails a request.

Listeners registered with ``add_listener`` are called with the new id set whenever the set of
endpoint ids changes (not on metric updates or on address/label changes of an existing id).
Everything runs on the event loop thread; nothing here is thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from epp.plugin import Endpoint, Metrics

Listener = Callable[[frozenset[str]], None]


class Datastore:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._endpoints: dict[str, Endpoint] = {}
        self._snapshot: tuple[Endpoint, ...] | None = ()
        self._routable: tuple[Endpoint, ...] | None = ()
        self._down: set[str] = set()
        self._listeners: list[Listener] = []
        self.version = 0
        self.changed_at = clock()

    def set_endpoints(self, endpoints: Sequence[Endpoint]) -> None:
        """Replace the endpoint set; endpoints whose id persists keep their metrics.

        A later entry with an id already in ``endpoints`` replaces the earlier one.
        """
        fresh: dict[str, Endpoint] = {}
        for endpoint in endpoints:
            old = self._endpoints.get(endpoint.id)
            if old is not None and old.metrics is not None and endpoint.metrics is None:
                endpoint = dataclasses.replace(endpoint, metrics=old.metrics)
            fresh[endpoint.id] = endpoint
        if fresh == self._endpoints and list(fresh) == list(self._endpoints):
            return
        ids_changed = fresh.keys() != self._endpoints.keys()
        self._endpoints = fresh
        self._down &= fresh.keys()
        self._changed()
        if ids_changed:
            ids = frozenset(fresh)
            for listener in tuple(self._listeners):
                listener(ids)

    def update_metrics(self, endpoint_id: str, metrics: Metrics) -> bool:
        """Store new metrics for an endpoint; False (ignored) if the id is no longer known."""
        endpoint = self._endpoints.get(endpoint_id)
        if endpoint is None:
            return False
        if endpoint.metrics is not metrics:
            self._endpoints[endpoint_id] = dataclasses.replace(endpoint, metrics=metrics)
            self._changed()
        return True

    def snapshot(self) -> tuple[Endpoint, ...]:
        """All endpoints in discovery order; the same tuple object until something changes."""
        if self._snapshot is None:
            self._snapshot = tuple(self._endpoints.values())
        return self._snapshot

    def routable(self) -> tuple[Endpoint, ...]:
        """The snapshot less the endpoints that are down (all of it if all are down)."""
        if self._routable is None:
            snapshot = self.snapshot()
            up = tuple(e for e in snapshot if e.id not in self._down) if self._down else snapshot
            self._routable = up or snapshot
        return self._routable

    def mark_down(self, endpoint_id: str) -> None:
        """Nothing listens on the endpoint's serving port: out of ``routable()``."""
        if endpoint_id in self._endpoints and endpoint_id not in self._down:
            self._down.add(endpoint_id)
            self._routable = None

    def mark_up(self, endpoint_id: str) -> None:
        if endpoint_id in self._down:
            self._down.discard(endpoint_id)
            self._routable = None

    @property
    def down(self) -> frozenset[str]:
        return frozenset(self._down)

    def get(self, endpoint_id: str) -> Endpoint | None:
        return self._endpoints.get(endpoint_id)

    def ids(self) -> frozenset[str]:
        return frozenset(self._endpoints)

    def __len__(self) -> int:
        return len(self._endpoints)

    def fresh_count(self, max_age: float) -> int:
        """Endpoints whose metrics were updated within ``max_age`` seconds of the clock
        (``update_time`` 0.0 means never scraped and is never fresh)."""
        cutoff = self._clock() - max_age
        return sum(
            1
            for e in self._endpoints.values()
            if e.metrics is not None
            and e.metrics.update_time > 0.0
            and e.metrics.update_time >= cutoff
        )

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self) -> None:
        self._snapshot = self._routable = None
        self.version += 1
        self.changed_at = self._clock()
