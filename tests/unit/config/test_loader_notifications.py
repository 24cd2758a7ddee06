"""The loader wires ``endpoint-notification-source`` with endpoint extractors under it."""

from __future__ import annotations

import textwrap

import pytest

from epp.config.loader import ConfigError, LoadOptions, load_config
from epp.datalayer.collector import NotificationPipeline, SourcePipeline
from epp.plugin.registry import PluginRegistry
from tests.builders import handle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return PluginRegistry.from_entry_points()


def load(body: str, registry: PluginRegistry) -> object:
    return load_config(
        HEAD + textwrap.dedent(body),
        registry=registry,
        handle_for=handle,
        options=LoadOptions(allow_experimental=True),
    )


def test_notification_source_carries_producers_as_extractors(registry: PluginRegistry) -> None:
    p = load(
        """\
        plugins:
        - type: endpoint-notification-source
        - type: mm-embeddings-cache-producer
        - type: precise-prefix-cache-producer
        dataLayer:
          sources:
          - pluginRef: endpoint-notification-source
            extractors:
            - pluginRef: mm-embeddings-cache-producer
            - pluginRef: precise-prefix-cache-producer
        """,
        registry,
    )
    sources = p.sources  # type: ignore[attr-defined]
    [notified] = [s for s in sources if isinstance(s, NotificationPipeline)]
    assert notified.source.typed_name.type == "endpoint-notification-source"
    assert [e.typed_name.type for e in notified.extractors] == [
        "mm-embeddings-cache-producer",
        "precise-prefix-cache-producer",
    ]
    # the default metrics source is still injected next to it
    polled = [s for s in sources if isinstance(s, SourcePipeline)]
    assert [s.source.typed_name.type for s in polled] == ["metrics-data-source"]


def test_plugin_that_hears_no_endpoint_events_is_rejected(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"extractors\[0\]: 'queue-scorer' does not hear"):
        load(
            """\
            plugins:
            - type: endpoint-notification-source
            - type: queue-scorer
            dataLayer:
              sources:
              - pluginRef: endpoint-notification-source
                extractors: [{pluginRef: queue-scorer}]
            """,
            registry,
        )


def test_same_extractor_type_twice_under_one_source_is_rejected(registry: PluginRegistry) -> None:
    with pytest.raises(
        ConfigError, match="duplicate extractor type 'mm-embeddings-cache-producer'"
    ):
        load(
            """\
            plugins:
            - type: endpoint-notification-source
            - type: mm-embeddings-cache-producer
              name: a
            - type: mm-embeddings-cache-producer
              name: b
            dataLayer:
              sources:
              - pluginRef: endpoint-notification-source
                extractors: [{pluginRef: a}, {pluginRef: b}]
            """,
            registry,
        )


def test_notification_producer_under_a_polled_source_is_still_rejected(
    registry: PluginRegistry,
) -> None:
    with pytest.raises(ConfigError, match="is not an extractor"):
        load(
            """\
            plugins:
            - type: metrics-data-source
            - type: precise-prefix-cache-producer
            dataLayer:
              sources:
              - pluginRef: metrics-data-source
                extractors: [{pluginRef: precise-prefix-cache-producer}]
            """,
            registry,
        )


def test_mm_scorer_alone_gets_the_default_mm_producer(registry: PluginRegistry) -> None:
    p = load(
        """\
        plugins:
        - type: mm-embeddings-cache-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: mm-embeddings-cache-scorer
        """,
        registry,
    )
    producers = [x.typed_name.name for x in p.producers]  # type: ignore[attr-defined]
    assert "mm-embeddings-cache-producer" in producers
