"""The handler as the loader builds it from a P/D config shaped like upstream's samples."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from epp.config.loader import load_config
from epp.plugin import PluginConfigError
from epp.plugin.registry import PluginRegistry
from epp.plugins.profiles.deciders import PrefixBasedPDDecider
from epp.plugins.profiles.disagg import DisaggProfileHandler
from tests.unit.plugins.profiles.disagg_helpers import PluginsHandle

# As upstream's pd-epp-config.yaml: the handler is declared before the decider it names, and no
# token or prefix producer is declared.
PD_CONFIG = textwrap.dedent("""\
    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    plugins:
    - type: prefix-cache-scorer
    - type: queue-scorer
    - type: prefill-filter
    - type: decode-filter
    - type: max-score-picker
    - type: disagg-profile-handler
      parameters:
        deciders:
          prefill: {decider}
    - type: prefix-based-pd-decider
      parameters:
        nonCachedTokens: 16
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: prefill-filter
      - pluginRef: max-score-picker
      - pluginRef: prefix-cache-scorer
        weight: 2
    - name: decode
      plugins:
      - pluginRef: decode-filter
      - pluginRef: max-score-picker
      - pluginRef: prefix-cache-scorer
        weight: 2
      - pluginRef: queue-scorer
    """)


def _load(decider: str) -> tuple[DisaggProfileHandler, PluginsHandle, dict[str, object]]:
    h = PluginsHandle()  # knows no plugin while the config loads, like the App's handle
    pipeline = load_config(
        PD_CONFIG.replace("{decider}", decider),
        registry=PluginRegistry.from_entry_points(),
        handle_for=lambda: h,
    )
    h.plugins.update(pipeline.instances)
    handler = pipeline.profile_handler
    assert isinstance(handler, DisaggProfileHandler)
    assert handler in pipeline.pre_request
    assert handler in pipeline.lifecycle
    return handler, h, pipeline.instances


def test_decider_declared_after_the_handler_resolves_when_the_epp_starts() -> None:
    handler, _, instances = _load("prefix-based-pd-decider")
    asyncio.run(handler.start())
    assert isinstance(handler._prefill_decider.get(), PrefixBasedPDDecider)
    # what the handler consumes makes the loader add the default producers, as upstream
    assert {"token-producer", "approx-prefix-cache-producer"} <= set(instances)


def test_misspelt_decider_stops_the_epp_at_start() -> None:
    handler, _, _ = _load("prefix-based-pd-decidr")
    with pytest.raises(PluginConfigError, match=r"deciders\.prefill: plugin not found"):
        asyncio.run(handler.start())
