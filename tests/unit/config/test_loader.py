from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.config.loader import ConfigError, LoadOptions, load_config, parse_config
from epp.plugin import PluginConfigError, UnknownPluginType
from epp.plugin.registry import PluginRegistry
from tests.builders import handle

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def registry() -> PluginRegistry:
    return PluginRegistry.from_entry_points()


def load(text: str | None, registry: PluginRegistry, **opts: bool):
    return load_config(
        None if text is None else textwrap.dedent(text),
        registry=registry,
        handle_for=handle,
        options=LoadOptions(**opts),
    )


HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_builtin_default_config_weights_and_auto_producers(registry: PluginRegistry) -> None:
    p = load(None, registry)
    weights = {s.typed_name.type: w for s, w in p.profiles["default"].scorers}
    assert weights == {
        "kv-cache-utilization-scorer": 1,
        "prefix-cache-scorer": 4,
        "estimated-load-scorer": 2,
        "no-hit-lru-scorer": 0.25,
    }
    assert sorted(x.typed_name.type for x in p.producers) == [
        "approx-prefix-cache-producer",
        "inflight-load-producer",
        "token-producer",
    ]


def test_upstream_default_config_has_upstream_weights_and_defaults(
    registry: PluginRegistry,
) -> None:
    from epp.config.schema import UPSTREAM_DEFAULT_CONFIG_TEXT

    p = load(UPSTREAM_DEFAULT_CONFIG_TEXT, registry)
    prof = p.profiles["default"]
    weights = {s.typed_name.type: w for s, w in prof.scorers}
    assert weights == {
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "prefix-cache-scorer": 3,
    }
    assert prof.picker.typed_name.type == "max-score-picker"
    assert p.profile_handler.typed_name.type == "single-profile-handler"
    assert [x.typed_name.type for x in p.parsers] == [
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",
    ]
    assert p.saturation_detector.typed_name.type == "utilization-detector"
    assert [(s.typed_name.type, [e.typed_name.type for e in ex]) for s, ex, *_ in p.sources] == [
        ("metrics-data-source", ["core-metrics-extractor"])
    ]
    assert p.feature_gates == {"flowControl": False, "haPopulateNonLeaderDatastore": True}


def test_no_profiles_puts_every_scorer_in_default_profile_with_weight_one(
    registry: PluginRegistry,
) -> None:
    p = load(HEAD + "plugins:\n- type: queue-scorer\n- type: load-aware-scorer\n", registry)
    assert [(s.typed_name.type, w) for s, w in p.profiles["default"].scorers] == [
        ("queue-scorer", 1.0),
        ("load-aware-scorer", 1.0),
    ]


# llm-d's multimodal precise-affinity guide (guides/multimodal/precise-affinity), unchanged: its
# token producer names a model and a render URL and no backend, which selects vLLM's render.
PRECISE_AFFINITY_GUIDE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: token-producer
    parameters:
      modelName: Qwen/Qwen3-VL-32B-Instruct
      vllm:
        url: http://localhost:8000
  - type: mm-embeddings-cache-producer
    parameters:
      cacheSizeInMBPerServer: 2048
  - type: mm-embeddings-cache-scorer
  - type: kv-cache-utilization-scorer
  - type: queue-scorer
  - type: no-hit-lru-scorer
  - type: decode-filter
  - type: max-score-picker
  - type: single-profile-handler
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: decode-filter
      - pluginRef: queue-scorer
        weight: 2.0
      - pluginRef: kv-cache-utilization-scorer
        weight: 2.0
      - pluginRef: mm-embeddings-cache-scorer
        weight: 10.0
      - pluginRef: no-hit-lru-scorer
        weight: 1.0
      - pluginRef: max-score-picker
"""


def test_multimodal_guide_selects_the_vllm_render_backend(registry: PluginRegistry) -> None:
    p = load(PRECISE_AFFINITY_GUIDE, registry)
    (producer,) = [x for x in p.producers if x.typed_name.type == "token-producer"]
    assert producer.params.selected == "vllm"
    assert producer.params.vllm.url == "http://localhost:8000"
    weights = {s.typed_name.type: w for s, w in p.profiles["default"].scorers}
    assert weights["mm-embeddings-cache-scorer"] == 10


def test_deprecated_api_version_is_accepted(registry: PluginRegistry) -> None:
    text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
    old, default = load(text, registry), load(None, registry)
    assert list(old.profiles) == list(default.profiles) == ["default"]
    assert [(s.typed_name.type, w) for s, w in old.profiles["default"].scorers] == [
        (s.typed_name.type, w) for s, w in default.profiles["default"].scorers
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(HEAD + "bogus: 1\n", "bogus: unknown field", id="unknown-top-level-key"),
        pytest.param("apiVersion: v9\nkind: EndpointPickerConfig\n", "apiVersion", id="api"),
        pytest.param(HEAD.replace("EndpointPickerConfig", "Foo"), "kind", id="kind"),
        pytest.param(
            HEAD + "featureGates: [warpDrive]\n", "unknown gate 'warpDrive'", id="unknown-gate"
        ),
        pytest.param(
            HEAD + "plugins:\n- type: queue-scorer\n- type: queue-scorer\n",
            "duplicate plugin name",
            id="duplicate-name",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n"
            "  plugins:\n  - pluginRef: nope\n",
            "pluginRef 'nope'",
            id="bad-ref",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n- name: b\n",
            "profile handler",
            id="two-profiles-no-handler",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: max-score-picker\n- {type: random-picker}\n"
            "schedulingProfiles:\n- name: a\n  plugins:\n  - pluginRef: max-score-picker"
            "\n  - pluginRef: random-picker\n",
            "more than one picker",
            id="two-pickers",
        ),
        pytest.param(
            HEAD + "plugins:\n- type: queue-scorer\n  extra: 1\n",
            "plugins[0].extra: unknown field",
            id="unknown-plugin-key",
        ),
        pytest.param("- a\n- b\n", "must be a YAML mapping", id="not-a-mapping"),
        pytest.param("a: [\n", "not valid YAML", id="bad-yaml"),
    ],
)
def test_invalid_config_is_rejected_with_location(
    registry: PluginRegistry, text: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(text, registry)


def test_bad_plugin_parameter_names_plugin_type_and_field_path(registry: PluginRegistry) -> None:
    text = (
        HEAD + "plugins:\n- name: la\n  type: load-aware-scorer\n  parameters:\n"
        "    threshold: 'high'\n"
    )
    with pytest.raises(PluginConfigError) as info:
        load(text, registry)
    msg = str(info.value)
    assert "'la'" in msg and "'load-aware-scorer'" in msg and "parameters.threshold" in msg


def test_unknown_parameter_key_is_rejected(registry: PluginRegistry) -> None:
    text = HEAD + "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoint: 2}\n"
    with pytest.raises(PluginConfigError, match=r"parameters\.maxNumOfEndpoint"):
        load(text, registry)


def test_an_unknown_plugin_type_suggests_the_closest_types_not_all_of_them(
    registry: PluginRegistry,
) -> None:
    with pytest.raises(UnknownPluginType) as typo:
        load(HEAD + "plugins:\n- type: queue-scorr\n", registry)
    # closest first (``multicluster-queue-scorer`` is close too)
    message = "unknown plugin type 'queue-scorr'; did you mean 'queue-scorer'"
    assert str(typo.value).startswith(message)
    with pytest.raises(UnknownPluginType) as far:
        load(HEAD + "plugins:\n- type: zzz\n", registry)
    assert "none of the" in str(far.value) and "`epp plugins list`" in str(far.value)
    assert "queue-scorer" not in str(far.value)  # no list of every type
    assert "queue-scorer" in far.value.available


def test_an_unknown_config_field_suggests_the_closest(registry: PluginRegistry) -> None:
    with pytest.raises(ConfigError, match=r"schedulingProfile: unknown field; did you mean "
                       r"'schedulingProfiles'\?"):  # fmt: skip
        load(HEAD + "schedulingProfile: []\n", registry)


def test_feature_gate_values(registry: PluginRegistry) -> None:
    p = load(HEAD + "featureGates: [flowControl, haPopulateNonLeaderDatastore=false]\n", registry)
    assert p.feature_gates == {"flowControl": True, "haPopulateNonLeaderDatastore": False}


def test_explicit_parsers_get_no_fallback(registry: PluginRegistry) -> None:
    text = HEAD + "requestHandler:\n  parsers:\n  - pluginRef: openai-parser\n"
    p = load(text, registry)
    assert [x.typed_name.type for x in p.parsers] == ["openai-parser"]


def test_inject_defaults_false_adds_no_metrics_source(registry: PluginRegistry) -> None:
    p = load(HEAD + "dataLayer:\n  injectDefaults: false\n", registry)
    assert p.sources == []


def test_parse_config_keeps_profile_weights() -> None:
    cfg = parse_config(
        HEAD + "schedulingProfiles:\n- name: x\n  plugins:\n  - {pluginRef: a, weight: 2.5}\n"
    )
    assert cfg.scheduling_profiles[0].plugins[0].weight == 2.5


CONFIGS = [
    p
    for p in sorted((REPO / "deploy" / "configs").glob("*.yaml"))
    if "kind: EndpointPickerConfig" in p.read_text()  # not the endpoints file beside them
]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_example_config_loads(registry: PluginRegistry, path: Path) -> None:
    # flow-control.yaml uses an alpha policy (and says --allow-experimental-plugins is needed)
    loaded = load(path.read_text(), registry, allow_experimental=True)
    declared = yaml.safe_load(path.read_text()) or {}
    names = [p["name"] for p in declared.get("schedulingProfiles") or []] or ["default"]
    assert list(loaded.profiles) == names
    for name, profile in loaded.profiles.items():
        assert profile.picker is not None, name


def test_alpha_plugin_needs_allow_experimental(registry: PluginRegistry) -> None:
    text = HEAD + "plugins:\n- type: priority-holdback-policy\n  parameters: {minCeiling: 0.5}\n"
    with pytest.raises(ConfigError, match="allow-experimental-plugins"):
        load(text, registry)


def test_capabilities_are_read_once_at_load_when_plugins_declare_them(
    registry: PluginRegistry,
) -> None:
    p = load(
        HEAD
        + textwrap.dedent(
            """
        plugins:
          - type: token-producer
            parameters: {backend: vllm, modelName: m, vllm: {timeout: 3s, mmTimeout: 7s}}
          - type: approx-prefix-cache-producer
          - {type: metrics-data-source, name: slow, parameters: {interval: 200ms}}
          - type: core-metrics-extractor
          - type: prefix-cache-scorer
        dataLayer:
          sources:
            - pluginRef: slow
              extractors: [{pluginRef: core-metrics-extractor}]
        """
        ),
        registry,
    )
    budgets = {
        producer.typed_name.type: timeout
        for producer, timeout in zip(p.producers, p.producer_timeouts, strict=True)
    }
    # token-producer is a ProducerTimeout; the approximate producer gets the default budget.
    assert budgets == {"token-producer": 7.0, "approx-prefix-cache-producer": 0.4}
    [source] = p.sources
    assert (source.source.typed_name.name, source.interval) == ("slow", pytest.approx(0.2))


def test_composed_plugin_is_built_through_the_handle_when_deprecated_scorer_is_configured(
    registry: PluginRegistry,
) -> None:
    p = load(
        HEAD + "plugins:\n  - {type: precise-prefix-cache-scorer, name: pp, parameters: "
        "{tokenProcessorConfig: {blockSizeTokens: 8}}}\n",
        registry,
    )
    scorer = p.instances["pp"]
    assert str(scorer.producer.typed_name) == "pp/precise-prefix-cache-producer"
    assert scorer.producer.params.token_processor_config.block_size_tokens == 8
    assert p.profiles["default"].scorers[0][0] is scorer
    with pytest.raises(PluginConfigError, match=r"blockSizeTokens.*must be > 0"):
        load(
            HEAD + "plugins:\n  - {type: precise-prefix-cache-scorer, parameters: "
            "{tokenProcessorConfig: {blockSizeTokens: 0}}}\n",
            registry,
        )


def test_partial_config_gets_builtin_default_scheduling_when_it_declares_none(
    registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="epp.config.profiles")
    partial = load(
        HEAD + "plugins:\n  - {type: file-discovery, parameters: {path: /x}}\n", registry
    )
    builtin = load(None, registry)

    def shape(p: Any) -> tuple[Any, ...]:
        prof = p.profiles["default"]
        return (
            [f.typed_name.type for f in prof.filters],
            [(s.typed_name.type, w) for s, w in prof.scorers],
            prof.picker.typed_name.type,
        )

    assert shape(partial) == shape(builtin)
    assert sorted(x.typed_name.type for x in partial.producers) == sorted(
        x.typed_name.type for x in builtin.producers
    )
    [record] = [r for r in caplog.records if "built-in default scheduling" in r.getMessage()]
    assert "prefix-cache-scorer (weight 4)" in record.getMessage()


def test_profile_without_scorer_is_named_in_a_warning_when_loaded(
    registry: PluginRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="epp.config.profiles")
    load(
        HEAD
        + "plugins:\n  - type: random-picker\nschedulingProfiles:\n"
        + "  - name: bare\n    plugins: [{pluginRef: random-picker}]\n",
        registry,
    )
    assert any(
        r.levelname == "WARNING" and "'bare' has no scorer" in r.getMessage()
        for r in caplog.records
    )


def test_unlisted_endpoint_extractor_hears_endpoint_events_when_declared_alone(
    registry: PluginRegistry,
) -> None:
    from epp.datalayer.collector import NotificationPipeline

    p = load(HEAD + "plugins:\n  - type: topology-extractor\n", registry, allow_experimental=True)
    [notified] = [s for s in p.sources if isinstance(s, NotificationPipeline)]
    assert notified.source.typed_name.type == "endpoint-notification-source"
    assert [e.typed_name.type for e in notified.extractors] == ["topology-extractor"]
