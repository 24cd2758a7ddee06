"""The list → watch loop (a "reflector") for one resource, run in its own thread.

    list  → replace the cache with the listed objects (what vanished is deleted) → on_change
    watch from the list's resourceVersion, with bookmarks and a server-side timeout:
        ADDED / MODIFIED → decode, store        DELETED → remove
        BOOKMARK         → advance resourceVersion only
        ERROR 410        → relist (never retry the same resourceVersion)
        other ERROR      → back off, watch again from the last resourceVersion
    clean end of stream (the timeout)  → watch again at once from the last resourceVersion
    any exception (HTTP error, broken connection, timeout) → back off, then retry the failed step

An object that fails to decode is logged, counted and treated as absent; the watch goes on. A
watch that ends cleanly within ``short_watch`` seconds having delivered nothing counts as a failure
(backs off), so a server that closes watches at once cannot make the loop spin.

``on_change`` gets a fresh ``{"<namespace>/<name>": decoded}`` dict after the list and after
each event that changed the cache; it runs on the reflector's thread (the caller hands it to its
event loop). The loop is testable without threads or time: the target, clock, sleep and an
iteration cap (one iteration = one list or one watch call) are injected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from epp.k8s.meta import DecodeError, object_key

T = TypeVar("T")


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): relist."""


class WatchError(Exception):
    """An ERROR event other than 410."""


class WatchTarget(Protocol):
    """One resource of one API server: how to list it and how to watch it."""

    name: str

    def list(self) -> tuple[list[Any], str]:
        """(raw items, the list's resourceVersion)."""
        ...

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterable[Mapping[str, Any]]:
        """Raw events ``{"type", "object"}``; raises ``Gone`` on 410."""
        ...

    def stop(self) -> None:
        """Interrupt a blocking ``watch`` (called from another thread)."""
        ...


@dataclass
class Backoff:
    """Exponential back-off: ``initial`` doubling up to ``maximum``; ``reset`` after success."""

    initial: float = 0.2
    maximum: float = 30.0
    _next: float = field(default=0.0, init=False)

    def next(self) -> float:
        delay = self._next or self.initial
        self._next = min(delay * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = 0.0


@dataclass
class ReflectorStats:
    lists: int = 0
    watches: int = 0
    gone: int = 0
    errors: int = 0
    decode_errors: int = 0
    events: int = 0


class Reflector(Generic[T]):
    def __init__(
        self,
        target: WatchTarget,
        decode: Callable[[Any], T],
        on_change: Callable[[dict[str, T]], None],
        *,
        watch_timeout: int = 300,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        max_iterations: int | None = None,
        short_watch: float = 1.0,
        logger: logging.Logger | None = None,
    ) -> None:
        self._target = target
        self._decode = decode
        self._on_change = on_change
        self._watch_timeout = watch_timeout
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._sleep = sleep
        self._max_iterations = max_iterations
        self._short_watch = short_watch
        self._log = logger or logging.getLogger(__name__)
        self._stopped = threading.Event()
        self._cache: dict[str, T] = {}
        self.resource_version = ""
        self.synced = False
        self.stats = ReflectorStats()

    def stop(self) -> None:
        self._stopped.set()
        self._target.stop()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def run(self) -> None:
        """Loop until ``stop()`` or the iteration cap."""
        need_list = True
        iterations = 0
        while not self.stopped and (
            self._max_iterations is None or iterations < self._max_iterations
        ):
            iterations += 1
            try:
                if need_list:
                    self._list()
                    need_list = False
                else:
                    self._watch()
            except Gone:
                self.stats.gone += 1
                self._log.info(
                    "%s: resourceVersion %s expired, relisting",
                    self._target.name,
                    self.resource_version,
                )
                need_list = True
            except Exception as exc:  # any failure: back off and retry the same step
                self.stats.errors += 1
                delay = self._backoff.next()
                self._log.warning(
                    "%s: %s failed (%s: %s); retrying in %.1fs",
                    self._target.name,
                    "list" if need_list else "watch",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self._pause(delay)

    def _pause(self, delay: float) -> None:
        if self._sleep is not None:
            self._sleep(delay)
        else:
            self._stopped.wait(delay)

    def _list(self) -> None:
        self.stats.lists += 1
        items, resource_version = self._target.list()
        cache: dict[str, T] = {}
        for raw in items:
            decoded = self._decode_one(raw)
            if decoded is not None:
                cache[decoded[0]] = decoded[1]
        self._cache = cache
        self.resource_version = resource_version
        self.synced = True
        self._backoff.reset()
        self._on_change(dict(cache))

    def _watch(self) -> None:
        self.stats.watches += 1
        started = self._clock()
        delivered = 0
        for event in self._target.watch(self.resource_version, self._watch_timeout):
            if self.stopped:
                return
            if delivered == 0:
                self._backoff.reset()  # the connection works again
            delivered += 1
            self._apply(event)
        if delivered == 0 and self._clock() - started < self._short_watch and not self.stopped:
            raise WatchError("watch closed immediately without events")
        self._backoff.reset()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, Mapping) else None
            if code == 410:
                raise Gone(str(obj.get("message", "")) if isinstance(obj, Mapping) else "")
            raise WatchError(f"ERROR event: {obj!r}")
        rv = _resource_version(obj)
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            self._log.warning("%s: ignoring watch event of type %r", self._target.name, kind)
            return
        self.stats.events += 1
        if rv:
            self.resource_version = rv
        try:
            key = object_key(obj)
        except DecodeError as exc:
            self.stats.decode_errors += 1
            self._log.warning("%s: skipping an event without a name: %s", self._target.name, exc)
            return
        if kind == "DELETED":
            changed = self._cache.pop(key, None) is not None
        else:
            decoded = self._decode_one(obj)
            if decoded is None:
                changed = self._cache.pop(key, None) is not None
            else:
                changed = True
                self._cache[key] = decoded[1]
        if changed:
            self._on_change(dict(self._cache))

    def _decode_one(self, raw: Any) -> tuple[str, T] | None:
        try:
            return object_key(raw), self._decode(raw)
        except Exception as exc:  # a bad object is skipped, never fatal
            self.stats.decode_errors += 1
            self._log.warning(
                "%s: skipping an object that does not decode: %s", self._target.name, exc
            )
            return None


def _resource_version(obj: Any) -> str:
    if isinstance(obj, Mapping):
        meta = obj.get("metadata")
        if isinstance(meta, Mapping):
            rv = meta.get("resourceVersion")
            if isinstance(rv, str):
                return rv
    return ""
