"""Kubernetes object notifications (``k8s-notification-source``): in Kubernetes mode, one
list → watch loop (``watch.Reflector``) per configured kind, in the pool's namespace, whose
changes become ``NotificationEvent``s for the source's extractors (``epp.plugin.notifications``).

The kind is found through API discovery (``kubernetes.dynamic``: any core or custom kind the
server serves); the reflector hands over a fresh ``{namespace/name: object}`` after each change
and ``Changes`` turns two of them into events: objects new or with another
``metadata.resourceVersion`` are ``ADD_OR_UPDATE``, objects gone are ``DELETE`` (so a relist
after a missed delete still delivers it). Events are delivered on the event loop: the source's
``notify`` first (``None`` drops the event), then each extractor, in configuration order; an
extractor that raises is logged and the others still hear it. A kind the server does not serve
is retried with back-off and logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from kubernetes import watch
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from epp.config.pipeline import KubeNotifications
from epp.k8s.meta import DecodeError
from epp.k8s.watch import Backoff, Gone, Reflector
from epp.plugin import EndpointEventType
from epp.plugin.notifications import GVK, NotificationEvent

log = logging.getLogger(__name__)

CONNECT_TIMEOUT: Final = 5.0
READ_TIMEOUT: Final = 30.0


class DynamicResource:
    """A ``watch.WatchTarget`` for any namespaced kind, resolved by API discovery (blocking)."""

    def __init__(self, api: ApiClient, gvk: GVK, namespace: str) -> None:
        from kubernetes.dynamic import DynamicClient

        api_version = f"{gvk.group}/{gvk.version}" if gvk.group else gvk.version
        self._client = DynamicClient(api)  # type: ignore[no-untyped-call]
        self._resource = self._client.resources.get(api_version=api_version, kind=gvk.kind)
        self._namespace = namespace
        self._watch: Any = None
        self.name = f"{gvk.kind}.{api_version}"

    def list(self) -> tuple[list[Any], str]:
        found = self._resource.get(
            namespace=self._namespace, _request_timeout=(CONNECT_TIMEOUT, READ_TIMEOUT)
        ).to_dict()
        return list(found.get("items") or []), str(found["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Mapping[str, Any]]:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        self._watch = w
        try:
            for event in self._client.watch(  # type: ignore[no-untyped-call]
                self._resource,
                namespace=self._namespace,
                resource_version=resource_version,
                timeout=timeout_seconds,
                watcher=w,
                allow_watch_bookmarks=True,
            ):
                yield {"type": event["type"], "object": event["raw_object"]}
        except ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc.reason)) from None
            raise
        finally:
            self._watch = None

    def stop(self) -> None:
        w = self._watch
        if w is not None:
            w.stop()


class Changes:
    """Successive snapshots of one kind → the events between them."""

    def __init__(self) -> None:
        self._versions: dict[str, str] = {}
        self._last: dict[str, Mapping[str, Any]] = {}

    def events(self, snapshot: Mapping[str, Mapping[str, Any]]) -> list[NotificationEvent]:
        out: list[NotificationEvent] = []
        versions: dict[str, str] = {}
        for key, obj in snapshot.items():
            version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            versions[key] = version
            if self._versions.get(key) != version:
                out.append(NotificationEvent(EndpointEventType.ADD_OR_UPDATE, obj))
        for key in self._versions.keys() - snapshot.keys():
            out.append(NotificationEvent(EndpointEventType.DELETE, self._last[key]))
        self._versions = versions
        self._last = dict(snapshot)
        return out


def deliver(pipeline: KubeNotifications, events: Sequence[NotificationEvent]) -> None:
    """Pass ``events`` through the source to its extractors (see the module docstring)."""
    source = pipeline.source
    for event in events:
        passed = source.notify(event)
        if passed is None:
            continue
        for extractor in pipeline.extractors:
            try:
                extractor.extract_notification(passed)
            except Exception:
                log.exception("notification extractor %s failed", extractor.typed_name)


class NotificationWatches:
    """The watches of every configured ``k8s-notification-source``, until cancelled."""

    def __init__(
        self,
        api: ApiClient,
        namespace: str,
        pipelines: Sequence[KubeNotifications],
        *,
        watch_timeout: int = 300,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._pipelines = list(pipelines)
        self._watch_timeout = watch_timeout
        self.reflectors: list[Reflector[Any]] = []

    async def run(self) -> None:
        if not self._pipelines:
            return
        loop = asyncio.get_running_loop()
        threads: list[threading.Thread] = []
        try:
            for pipeline in self._pipelines:
                reflector = await self._reflector(pipeline, loop)
                self.reflectors.append(reflector)
                thread = threading.Thread(
                    target=reflector.run, name=f"notify {pipeline.source.gvk.kind}", daemon=True
                )
                thread.start()
                threads.append(thread)
            await asyncio.Event().wait()
        finally:
            for r in self.reflectors:
                r.stop()
            for t in threads:
                await asyncio.to_thread(t.join, 5.0)

    async def _reflector(
        self, pipeline: KubeNotifications, loop: asyncio.AbstractEventLoop
    ) -> Reflector[Any]:
        gvk = pipeline.source.gvk
        backoff = Backoff(initial=0.5, maximum=30.0)
        while True:
            try:
                target = await asyncio.to_thread(DynamicResource, self._api, gvk, self._namespace)
                break
            except Exception as exc:  # not served (yet), or the API server unreachable
                delay = backoff.next()
                log.warning("cannot watch %s (%s); retrying in %.1fs", gvk, exc, delay)
                await asyncio.sleep(delay)
        changes = Changes()

        def on_change(snapshot: dict[str, Any]) -> None:
            events = changes.events(snapshot)
            if events and not loop.is_closed():
                loop.call_soon_threadsafe(deliver, pipeline, events)

        return Reflector(target, _as_mapping, on_change, watch_timeout=self._watch_timeout)


def _as_mapping(obj: Any) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise DecodeError(f"not an object: {type(obj).__name__}")
    return obj


def notification_watches(
    api: ApiClient, namespace: str, pipelines: Sequence[KubeNotifications], watch_timeout: int
) -> NotificationWatches | None:
    if not pipelines:
        return None
    return NotificationWatches(api, namespace, pipelines, watch_timeout=watch_timeout)
