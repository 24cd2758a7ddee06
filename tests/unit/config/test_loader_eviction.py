"""The loader's eviction defaults: with ``flowControl.enableEviction`` upstream's two policies
are built by the EPP itself (no ``--allow-experimental-plugins``), unless the config declares
its own."""

from __future__ import annotations

import pytest

from epp.config.loader import ConfigError, LoadOptions, load_config
from epp.plugin.registry import PluginRegistry
from tests.builders import handle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n"
EVICTION = "flowControl: {enableEviction: true}\n"
DEFAULTS = {"sheddable-eviction-filter", "priority-then-time-eviction-order-policy"}


def _types(text: str, **opts: bool) -> set[str]:
    pipeline = load_config(
        text,
        registry=PluginRegistry.from_entry_points(),
        handle_for=handle,
        options=LoadOptions(**opts),
    )
    return {p.typed_name.type for p in pipeline.instances.values()}


def test_eviction_gets_upstreams_policies_without_the_experimental_flag() -> None:
    assert _types(HEAD + EVICTION) >= DEFAULTS
    assert not DEFAULTS & _types(HEAD)  # no eviction: not built


def test_declaring_them_is_alpha_like_upstream() -> None:
    declared = HEAD + "plugins:\n- type: sheddable-eviction-filter\n" + EVICTION
    with pytest.raises(ConfigError, match="alpha"):
        _types(declared)
    assert _types(declared, allow_experimental=True) >= DEFAULTS
