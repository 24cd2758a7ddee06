"""``k8s-notification-source``: tells plugins when Kubernetes objects of one kind are created,
changed or deleted (upstream's source, same parameters).

A ``dataLayer.sources`` entry that is never polled. In Kubernetes mode the EPP lists and watches
``kind`` (of ``group``/``version``) in the pool's namespace and passes each change to the
extractors listed under this source: plugins implementing
``epp.plugin.notifications.NotificationExtractor`` (``extract_notification(event)``), with an
event of type ``ADD_OR_UPDATE`` (created or changed) or ``DELETE`` and the object as the API
server sent it. The source passes events through unchanged, as upstream's. Outside Kubernetes
mode no event comes (logged at start-up). One source watches one kind; declare one per kind.

Parameters: ``group`` (``""``: the core API), ``version`` and ``kind`` (both required).

YAML::

    plugins:
    - type: k8s-notification-source
      name: configmaps
      parameters: {group: "", version: v1, kind: ConfigMap}
    - type: my-configmap-extractor
    dataLayer:
      sources:
      - pluginRef: configmaps
        extractors: [{pluginRef: my-configmap-extractor}]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import EndpointEventType, Handle, PluginBase, Stability
from epp.plugin.notifications import GVK, NotificationEvent


class K8sNotificationSource(PluginBase):
    TYPE: ClassVar[str] = "k8s-notification-source"
    STABILITY: ClassVar[Stability] = Stability.BETA

    @dataclass(frozen=True)
    class Params:
        group: str = ""
        version: str = ""
        kind: str = ""

        def __post_init__(self) -> None:
            if not self.version or not self.kind:
                raise ValueError("version and kind are required for k8s-notification-source")

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._gvk = GVK(params.group, params.version, params.kind)
        self.events = dict.fromkeys((t.value for t in EndpointEventType), 0)
        """Events passed on, by type (for ``dump_state``)."""

    @property
    def gvk(self) -> GVK:
        return self._gvk

    def notify(self, event: NotificationEvent) -> NotificationEvent | None:
        self.events[event.type.value] += 1
        return event

    def dump_state(self) -> Mapping[str, Any]:
        return {"gvk": str(self._gvk), "events": dict(self.events)}
