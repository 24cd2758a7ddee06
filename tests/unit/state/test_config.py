"""``dataLayer.crossReplicaSyncerPluginRef`` / ``crossReplicaSyncInterval`` / ``peerDiscovery``
as the loader reads them, and the ``SharedState`` slot of the pipeline."""

from __future__ import annotations

import textwrap

import pytest

from epp.config.loader import ConfigError, load_config
from epp.config.pipeline import Pipeline
from epp.plugin.registry import PluginRegistry
from epp.plugins.sync.redis import RedisSyncer
from tests.builders import handle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
PLUGINS = """\
plugins:
- type: redis-syncer
  name: shared
  parameters: {url: "redis://10.0.0.9:6379"}
- type: prefix-cache-scorer
- type: queue-scorer
"""


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return PluginRegistry.from_entry_points()


def load(registry: PluginRegistry, data_layer: str, plugins: str = PLUGINS) -> Pipeline:
    text = HEAD + plugins + "dataLayer:\n" + textwrap.indent(textwrap.dedent(data_layer), "  ")
    return load_config(text, registry=registry, handle_for=handle)


def test_syncer_ref_and_interval_are_wired(registry: PluginRegistry) -> None:
    p = load(registry, "crossReplicaSyncerPluginRef: shared\ncrossReplicaSyncInterval: 50ms\n")
    assert isinstance(p.syncer, RedisSyncer)
    assert p.syncer.typed_name.name == "shared"
    assert p.sync_interval == pytest.approx(0.05)
    # the auto-created approximate prefix producer shares its index
    assert "approx-prefix-cache-producer" in [x.typed_name.type for x in p.shared]
    described = p.describe()
    assert described["crossReplicaSyncer"] == "shared/redis-syncer"
    assert "approx-prefix-cache-producer/approx-prefix-cache-producer" in described["sharedState"]


@pytest.mark.parametrize("interval", ["", "0s", "-1s"])
def test_interval_absent_or_not_positive_is_200ms(registry: PluginRegistry, interval: str) -> None:
    line = f"crossReplicaSyncInterval: '{interval}'\n" if interval else ""
    p = load(registry, "crossReplicaSyncerPluginRef: shared\n" + line)
    assert p.sync_interval == pytest.approx(0.2)


def test_without_a_syncer_nothing_syncs(registry: PluginRegistry) -> None:
    p = load(registry, "crossReplicaSyncInterval: 1s\n")
    assert p.syncer is None
    assert "crossReplicaSyncer" not in p.describe()


def test_a_syncer_type_named_but_not_declared_is_created(registry: PluginRegistry) -> None:
    p = load(registry, "crossReplicaSyncerPluginRef: redis-syncer\n")
    assert isinstance(p.syncer, RedisSyncer)


@pytest.mark.parametrize(
    ("data_layer", "fragment"),
    [
        pytest.param(
            "crossReplicaSyncerPluginRef: queue-scorer\n",
            "dataLayer.crossReplicaSyncerPluginRef: 'queue-scorer' is not a cross-replica syncer",
            id="not-a-syncer",
        ),
        pytest.param(
            "crossReplicaSyncerPluginRef: nowhere\n",
            "dataLayer.crossReplicaSyncerPluginRef: pluginRef 'nowhere' names no declared plugin",
            id="unknown-ref",
        ),
        pytest.param(
            "crossReplicaSyncerPluginRef: shared\ncrossReplicaSyncInterval: soon\n",
            "dataLayer.crossReplicaSyncInterval: invalid duration 'soon'",
            id="bad-interval",
        ),
    ],
)
def test_bad_sync_config_fails_at_load_naming_the_field(
    registry: PluginRegistry, data_layer: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(registry, data_layer)
    assert fragment in str(err.value)


def test_peer_discovery_is_accepted_and_ignored(registry: PluginRegistry) -> None:
    p = load(registry, "peerDiscovery: {pluginRef: some-peer-discovery}\n")
    assert p.syncer is None
