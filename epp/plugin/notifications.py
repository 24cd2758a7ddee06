"""Kubernetes object notifications: the contract of ``k8s-notification-source`` and its
extractors (upstream's ``NotificationSource`` / ``NotificationExtractor``).

A ``NotificationSource`` names one kind (``gvk``). In Kubernetes mode the EPP watches that kind
in the pool's namespace and, for every object created or changed (``ADD_OR_UPDATE``) or deleted
(``DELETE``), calls the source's ``notify`` and hands what it returns (``None`` drops the event)
to each ``NotificationExtractor`` listed under the source in ``dataLayer.sources``. The object is
the API server's JSON as a mapping (upstream's ``unstructured.Unstructured``), a copy per event.
Extractors are called on the event loop, synchronously: they must return quickly and never
block (schedule I/O on the plugin's own task); one that raises is logged and the others still
hear the event. Outside Kubernetes mode there is no API server to watch and no event comes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from epp.plugin.protocols import EndpointEventType
from epp.plugin.types import TypedName


class GVK(NamedTuple):
    """A Kubernetes group, version and kind (``group`` is ``""`` for the core API)."""

    group: str
    version: str
    kind: str

    def __str__(self) -> str:  # upstream's schema.GroupVersionKind.String()
        return f"{self.group}/{self.version}, Kind={self.kind}"


@dataclass(frozen=True, slots=True)
class NotificationEvent:
    type: EndpointEventType
    object: Mapping[str, Any]


@runtime_checkable
class NotificationSource(Protocol):
    typed_name: TypedName

    @property
    def gvk(self) -> GVK: ...

    def notify(self, event: NotificationEvent) -> NotificationEvent | None: ...


@runtime_checkable
class NotificationExtractor(Protocol):
    typed_name: TypedName

    def extract_notification(self, event: NotificationEvent) -> None: ...
