"""``endpoint-notification-source``: tells plugins when endpoints join or leave the pool.

A ``dataLayer.sources`` entry that is never polled. Its ``extractors`` are plugins that implement
``epp.plugin.EndpointExtractor`` (``extract_endpoint(event)``); they hear an
``EndpointEvent`` with type ``ADD_OR_UPDATE`` when an endpoint joins the pool or its address,
port, labels or rank change, and ``DELETE`` when it leaves (a changed address is a ``DELETE`` of
the old endpoint followed by an ``ADD_OR_UPDATE`` of the new one). The collector delivers the
events as it sees the endpoint set change; the source passes them through unchanged, as
upstream's does. Metric updates are not events.

Extractors that listen: ``precise-prefix-cache-producer`` (subscribes to an added pod's KV
events and unsubscribes, clearing its index entries, when it leaves) and
``mm-embeddings-cache-producer`` (drops a removed pod's cache). Listing a plugin that does not
implement ``EndpointExtractor``, or one type twice under the same source, fails at startup.

No parameters. YAML::

    plugins:
      - type: endpoint-notification-source
      - type: precise-prefix-cache-producer
    dataLayer:
      sources:
        - pluginRef: endpoint-notification-source
          extractors:
            - pluginRef: precise-prefix-cache-producer

Differences from upstream: none in behaviour. Events of other Kubernetes kinds come from
``k8s-notification-source``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from epp.plugin import (
    EndpointEvent,
    EndpointEventType,
    Handle,
    NoParams,
    PluginBase,
    Stability,
)


class EndpointNotificationSource(PluginBase):
    TYPE: ClassVar[str] = "endpoint-notification-source"
    STABILITY: ClassVar[Stability] = Stability.BETA
    Params = NoParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log = handle.logger(self.typed_name)
        self.events = dict.fromkeys((t.value for t in EndpointEventType), 0)
        """Events passed on, by type (for ``dump_state``)."""

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None:
        self.events[event.type.value] += 1
        self._log.debug("endpoint %s: %s", event.endpoint.id, event.type.value)
        return event

    def dump_state(self) -> Mapping[str, Any]:
        return {"events": dict(self.events)}
