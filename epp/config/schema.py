"""``EndpointPickerConfig`` (``llm-d.ai/v1alpha1``) as strict dataclasses.

The YAML is decoded with the same strict decoder as plugin parameters: an unknown key anywhere is
an error naming its path. Field names map to camelCase YAML keys.

Example::

    apiVersion: llm-d.ai/v1alpha1
    kind: EndpointPickerConfig
    featureGates: [flowControl]
    plugins:
    - type: queue-scorer
    - name: kv
      type: kv-cache-utilization-scorer
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv
        weight: 2
    dataLayer:
      discovery: {pluginRef: file-discovery}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

# The flow-control policies instantiated with default parameters when not declared (spec §3.3.5).
DEFAULT_ORDERING: Final = "fcfs-ordering-policy"
DEFAULT_FAIRNESS: Final = "global-strict-fairness-policy"
DEFAULT_USAGE_LIMIT: Final = "static-usage-limit-policy"
DEFAULT_POLICY_TYPES: Final = (DEFAULT_ORDERING, DEFAULT_FAIRNESS, DEFAULT_USAGE_LIMIT)
DEFAULT_EVICTION_FILTER: Final = "sheddable-eviction-filter"
DEFAULT_EVICTION_ORDERING: Final = "priority-then-time-eviction-order-policy"

API_VERSIONS: Final = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
DEPRECATED_API_VERSION: Final = "inference.networking.x-k8s.io/v1alpha1"
KIND: Final = "EndpointPickerConfig"


@dataclass(frozen=True)
class PluginSpec:
    type: str
    name: str = ""
    parameters: Any = None


@dataclass(frozen=True)
class PluginRef:
    plugin_ref: str


@dataclass(frozen=True)
class ProfilePluginRef:
    plugin_ref: str
    weight: float | None = None


@dataclass(frozen=True)
class SchedulingProfileSpec:
    name: str
    plugins: tuple[ProfilePluginRef, ...] = ()


@dataclass(frozen=True)
class SourceSpec:
    plugin_ref: str
    extractors: tuple[PluginRef, ...] = ()


@dataclass(frozen=True)
class DataLayerSpec:
    inject_defaults: bool = True
    sources: tuple[SourceSpec, ...] = ()
    discovery: PluginRef | None = None
    peer_discovery: PluginRef | None = None
    cross_replica_syncer_plugin_ref: str = ""
    cross_replica_sync_interval: str = "200ms"


@dataclass(frozen=True)
class PriorityBandSpec:
    priority: int
    max_bytes: str | int | None = None
    max_requests: str | int | None = None
    fairness_policy_ref: str = ""
    ordering_policy_ref: str = ""


@dataclass(frozen=True)
class BandTemplateSpec:
    max_bytes: str | int | None = None
    max_requests: str | int | None = None
    fairness_policy_ref: str = ""
    ordering_policy_ref: str = ""


@dataclass(frozen=True)
class FlowControlSpec:
    max_bytes: str | int | None = None
    max_requests: str | int | None = None
    default_request_ttl: str = field(default="", metadata={"yaml": "defaultRequestTTL"})
    no_endpoint_request_ttl: str = field(default="", metadata={"yaml": "noEndpointRequestTTL"})
    default_priority_band: BandTemplateSpec | None = None
    default_negative_priority_band: BandTemplateSpec | None = None
    priority_bands: tuple[PriorityBandSpec, ...] = ()
    usage_limit_policy_plugin_ref: str = ""
    saturation_detector: PluginRef | None = None
    enable_eviction: bool = False


@dataclass(frozen=True)
class RequestHandlerSpec:
    parsers: tuple[PluginRef, ...] = ()


@dataclass(frozen=True)
class EndpointPickerConfig:
    api_version: str
    kind: str
    feature_gates: tuple[str, ...] = ()
    plugins: tuple[PluginSpec, ...] = ()
    scheduling_profiles: tuple[SchedulingProfileSpec, ...] = ()
    data_layer: DataLayerSpec | None = None
    flow_control: FlowControlSpec | None = None
    request_handler: RequestHandlerSpec | None = None
    # Deprecated top-level forms; the nested fields win when both are set.
    saturation_detector: PluginRef | None = None
    parser: PluginRef | None = None


FEATURE_GATES: Final = {"flowControl": False, "haPopulateNonLeaderDatastore": True}

UPSTREAM_DEFAULT_CONFIG_TEXT: Final = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""
"""llm-d's built-in default (spec §3.2): queue 2, kv-cache 2, prefix 3."""

DEFAULT_CONFIG_TEXT: Final = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: response-affinity-filter
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: estimated-load-scorer
- type: no-hit-lru-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: response-affinity-filter
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 4
  - pluginRef: estimated-load-scorer
    weight: 2
  - pluginRef: no-hit-lru-scorer
    weight: 0.25
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""
"""This EPP's built-in default: a Responses API follow-up goes to the server holding its previous
response (``response-affinity-filter``); then prefix affinity first, then the estimated load
(``estimated-load-scorer``: each pod's scraped queue and running requests, corrected by what this
EPP dispatched and saw complete since the scrape, so it is exact between scrapes and still sees
other replicas and foreign traffic), then KV-cache headroom; among pods that are otherwise equal,
cold requests go to the least recently used one (``no-hit-lru-scorer`` at 0.25, a tie-breaker: at
weight 1 it outweighed a 3-request queue, sending an idle EPP's second cold request to a pod with 3
waiting rather than to an idle one). On the agentic benchmark (``epp bench --workloads b``)
upstream's default reached 97.8% of the achievable prefix reuse with the busiest pod at 3.1x the
mean, this one 99.9% at 1.0x; with a pod loaded by traffic the EPP never sees (``b-foreign``) it
sends that pod nothing, where counting only its own requests sent it a quarter (see
docs/agents.md). ``kv-headroom-filter`` (no pod gets a request its KV cache cannot take) is not in
it: on the KV-pressure benchmark (``b-pressure``) it cost 6 to 10 points of the achievable reuse
(91.3% against 97.1% of the oracle, twice the evictions) with the same single preemption;
``deploy/configs/agents-flow-control.yaml`` uses it with flow control."""
