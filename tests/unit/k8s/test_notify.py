"""Kubernetes object notifications: the ``k8s-notification-source`` plugin, how snapshots become
events (``epp.k8s.notify.Changes``), their delivery, and the loader's wiring."""

from __future__ import annotations

from typing import Any

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import load_config
from epp.config.pipeline import KubeNotifications
from epp.k8s.notify import Changes, deliver
from epp.plugin import EndpointEventType, TypedName
from epp.plugin.notifications import GVK, NotificationEvent
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugins.sources.k8s_notification import K8sNotificationSource
from tests.builders import FakeHandle

ADD, DELETE = EndpointEventType.ADD_OR_UPDATE, EndpointEventType.DELETE


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": version}}


def source(**params: str) -> K8sNotificationSource:
    p = decode(K8sNotificationSource.Params, params)
    return K8sNotificationSource(name="cm", params=p, handle=FakeHandle())


def test_snapshots_become_adds_updates_and_deletes() -> None:
    changes = Changes()
    first = changes.events({"ns/a": obj("a", "1"), "ns/b": obj("b", "2")})
    assert [(e.type, e.object["metadata"]["name"]) for e in first] == [(ADD, "a"), (ADD, "b")]
    assert changes.events({"ns/a": obj("a", "1"), "ns/b": obj("b", "2")}) == []  # nothing new
    later = changes.events({"ns/a": obj("a", "3")})  # a changed, b gone (a relist says so too)
    assert [(e.type, e.object["metadata"]["resourceVersion"]) for e in later] == [
        (ADD, "3"),
        (DELETE, "2"),
    ]


class Recorder:
    typed_name = TypedName("recorder", "recorder")

    def __init__(self, fail: bool = False) -> None:
        self.heard: list[NotificationEvent] = []
        self.fail = fail

    def extract_notification(self, event: NotificationEvent) -> None:
        self.heard.append(event)
        if self.fail:
            raise RuntimeError("boom")


def test_events_pass_through_the_source_to_every_extractor_even_when_one_raises() -> None:
    src = source(version="v1", kind="ConfigMap")
    failing, listening = Recorder(fail=True), Recorder()
    event = NotificationEvent(ADD, obj("a", "1"))
    deliver(KubeNotifications(src, (failing, listening)), [event, NotificationEvent(DELETE, {})])
    assert listening.heard == [event, NotificationEvent(DELETE, {})]
    assert len(failing.heard) == 2
    assert src.dump_state() == {
        "gvk": "/v1, Kind=ConfigMap",
        "events": {"add-or-update": 1, "delete": 1},
    }


def test_the_source_names_its_kind_and_requires_version_and_kind() -> None:
    assert source(group="apps", version="v1", kind="Deployment").gvk == GVK(
        "apps", "v1", "Deployment"
    )
    with pytest.raises(ParamError, match="version and kind are required"):
        decode(K8sNotificationSource.Params, {"kind": "Pod"})


CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: k8s-notification-source
  parameters: {version: v1, kind: ConfigMap}
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: k8s-notification-source
    extractors: [{pluginRef: %s}]
"""


def test_the_loader_wires_the_source_apart_from_the_polled_ones() -> None:
    text = CONFIG.replace("    extractors: [{pluginRef: %s}]\n", "    extractors: []\n")
    pipeline = load_config(text, registry=PluginRegistry.from_entry_points(), handle_for=FakeHandle)
    (wired,) = pipeline.kube_notifications
    assert wired.source.typed_name.type == "k8s-notification-source" and wired.extractors == ()
    assert all(p.source is not wired.source for p in pipeline.sources)


def test_an_extractor_that_does_not_hear_notifications_is_refused() -> None:
    with pytest.raises(ConfigError, match="does not hear Kubernetes notifications"):
        load_config(
            CONFIG % "queue-scorer",
            registry=PluginRegistry.from_entry_points(),
            handle_for=FakeHandle,
        )
