"""``k8s-notification-source`` in Kubernetes mode, against the test API server: creating,
changing and deleting ConfigMaps in the pool's namespace reach the listed extractor as events,
and objects of another namespace do not."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import pytest

from epp.app import App
from epp.plugin import NoParams, PluginBase
from epp.plugin.notifications import NotificationEvent
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry
from epp_tools.bench.kube.apiserver import LocalApiServer
from epp_tools.bench.kube.objects import POOLS, Resource, pool
from tests.conftest import make_settings, wait_for
from tests.k8s.conftest import MODEL_LABELS, POOL

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
HEARD: list[tuple[str, str, str]] = []  # (event type, name, data value): what Recorder heard

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: k8s-notification-source
  name: configmaps
  parameters: {group: "", version: v1, kind: ConfigMap}
- type: test-notification-recorder
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: configmaps
    extractors: [{pluginRef: test-notification-recorder}]
"""


class Recorder(PluginBase):
    """A notification extractor that records what it hears."""

    TYPE: ClassVar[str] = "test-notification-recorder"
    Params = NoParams

    def extract_notification(self, event: NotificationEvent) -> None:
        meta = event.object.get("metadata", {})
        value = str((event.object.get("data") or {}).get("k", ""))
        HEARD.append((event.type.value, meta.get("name", ""), value))


def registry() -> PluginRegistry:
    base = PluginRegistry.from_entry_points()
    infos = [base.info(t) for t in base.types()]
    ep = metadata.EntryPoint(Recorder.TYPE, f"{__name__}:Recorder", GROUP)
    infos.append(PluginInfo(Recorder.TYPE, ep.value, "tests", "0", ep))
    return PluginRegistry(infos)


def configmap(name: str, value: str, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"k": value},
    }


@pytest.fixture
async def app(apiserver: LocalApiServer, tmp_path: Path) -> AsyncIterator[App]:
    HEARD.clear()
    apiserver.install(CONFIGMAPS)
    apiserver.create(POOLS, pool(POOL, MODEL_LABELS, (8000,)))
    apiserver.create(CONFIGMAPS, configmap("before", "0"))  # there before the EPP starts
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    settings = make_settings(
        CONFIG, kubeconfig=str(kubeconfig), pool_name=POOL, pool_namespace="default"
    )
    async with contextlib.AsyncExitStack() as stack:
        epp = App(settings, registry=registry())
        await stack.enter_async_context(epp)
        await epp.wait_ready(60)  # bounds a failure only
        yield epp


async def test_configmap_changes_reach_the_extractor_as_events(
    app: App, apiserver: LocalApiServer
) -> None:
    await wait_for(lambda: ("add-or-update", "before", "0") in HEARD, 15)
    apiserver.create(CONFIGMAPS, configmap("cm", "1"))
    apiserver.create(CONFIGMAPS, configmap("elsewhere", "9", namespace="other"))
    await wait_for(lambda: ("add-or-update", "cm", "1") in HEARD, 15)
    changed = apiserver.get(CONFIGMAPS, "cm")
    changed["data"] = {"k": "2"}
    apiserver.replace(CONFIGMAPS, changed)
    await wait_for(lambda: ("add-or-update", "cm", "2") in HEARD, 15)
    apiserver.delete(CONFIGMAPS, "cm")
    await wait_for(lambda: ("delete", "cm", "2") in HEARD, 15)
    assert not [h for h in HEARD if h[1] == "elsewhere"]  # only the pool's namespace
    assert app.pipeline.instances["configmaps"].events == {"add-or-update": 3, "delete": 1}
