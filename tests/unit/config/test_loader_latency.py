"""Loading the latency-prediction plugins: llm-d's Helm config as it ships, the default producer
of ``LatencyPredictionInfo``, and a profile that names a data producer."""

from __future__ import annotations

import logging
import textwrap

import pytest

from epp.config.loader import ConfigError, LoadOptions, load_config
from epp.plugin.registry import PluginRegistry
from tests.builders import handle
from tests.latency_configs import GUIDE_CONFIGS, HELM_LATENCY, README_EXAMPLES

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return PluginRegistry.from_entry_points()


def load(text: str, registry: PluginRegistry) -> object:
    return load_config(
        HEAD + textwrap.dedent(text), registry=registry, handle_for=handle, options=LoadOptions()
    )


def test_helm_latency_config_loads_as_upstream_runs_it(
    registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        p = load(HELM_LATENCY, registry)
    profile = p.profiles["default"]  # type: ignore[attr-defined]
    assert [f.typed_name.name for f in profile.filters] == [
        "strict-affinity-filter",
        "slo-headroom-tier-filter",
        "loose-affinity-filter",
    ]
    assert [(s.typed_name.type, w) for s, w in profile.scorers] == [("latency-scorer", 1.0)]
    assert profile.picker.typed_name.type == "weighted-random-picker"
    assert [a.typed_name.type for a in p.admitters] == ["latency-slo-admitter"]  # type: ignore[attr-defined]
    producers = sorted(x.typed_name.type for x in p.producers)  # type: ignore[attr-defined]
    assert producers == [
        "approx-prefix-cache-producer",
        "inflight-load-producer",
        "predicted-latency-producer",
        "token-producer",
    ]
    assert "names 'predicted-latency-producer', which is not a filter" in caplog.text


def test_a_latency_consumer_alone_gets_the_default_producer(registry: PluginRegistry) -> None:
    p = load("plugins:\n- type: latency-scorer\n", registry)
    producers = {x.typed_name.name for x in p.producers}  # type: ignore[attr-defined]
    assert "predicted-latency-producer" in producers


def test_a_profile_naming_a_plugin_with_no_request_role_is_still_refused(
    registry: PluginRegistry,
) -> None:
    text = (
        "plugins:\n- type: queue-scorer\n- type: openai-parser\nschedulingProfiles:\n"
        "- name: default\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: openai-parser\n"
    )
    with pytest.raises(ConfigError, match="'openai-parser' is not a filter, scorer or picker"):
        load(text, registry)


@pytest.mark.parametrize("name", sorted(README_EXAMPLES))
def test_upstream_readme_examples_load(registry: PluginRegistry, name: str) -> None:
    p = load(README_EXAMPLES[name], registry)
    types = {x.typed_name.type for x in p.producers}  # type: ignore[attr-defined]
    assert "predicted-latency-producer" in types or name == "prefix-cache-affinity-filter"
    assert p.profiles["default"].picker is not None  # type: ignore[attr-defined]


GUIDES = [
    "predicted-latency",
    "predicted-latency-slo",
    "predicted-latency-pd",
    "predicted-latency-multimodal",
]


@pytest.mark.parametrize("name", GUIDES)
def test_llm_d_guide_configs_load(registry: PluginRegistry, name: str) -> None:
    p = load_config(
        GUIDE_CONFIGS[name], registry=registry, handle_for=handle, options=LoadOptions()
    )
    latency = [s for prof in p.profiles.values() for s, _ in prof.scorers]
    assert latency and all(s.typed_name.type == "latency-scorer" for s in latency)
    assert "predicted-latency-producer" in {x.typed_name.type for x in p.producers}
