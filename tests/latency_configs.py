"""llm-d's example configs that name the latency-prediction plugins, as they ship."""

from __future__ import annotations

# llm-d-router's Helm chart (config/charts/routerlib/templates/_config.yaml) with
# router.latencyPredictor.enabled, as rendered: its plugins and the default profile.
HELM_LATENCY = """\
plugins:
- type: predicted-latency-producer
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.99
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters:
    affinityThreshold: 0.80
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""

# The "Configuration Example" of each plugin's README in llm-d-router (pkg/epp/framework/plugins/
# scheduling/filter/sloheadroomtier, .../filter/prefixcacheaffinity,
# .../requestcontrol/admitter/latencyslo).
README_EXAMPLES = {
    "slo-headroom-tier-filter": """\
plugins:
  - type: slo-headroom-tier-filter
    name: slo-tier
    parameters:
      epsilonExploreNeg: 0.01
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: slo-tier
""",
    "prefix-cache-affinity-filter": """\
plugins:
  - type: prefix-cache-affinity-filter
    name: prefix-affinity
    parameters:
      affinityThreshold: 0.80
      explorationProbability: 0.01
      maxTTFTPenaltyMs: 5000
      ttftSource: prefillThroughput
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: prefix-affinity
""",
    "latency-slo-admitter": """\
plugins:
  - type: latency-slo-admitter
    name: latency-admitter
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: latency-admitter
""",
}

# The EndpointPickerConfigs of llm-d's predicted-latency routing guide
# (llm-d/llm-d guides/predicted-latency-routing/router/*.values.yaml, router.epp
# pluginsCustomConfig), as the guide ships them.
GUIDE_CONFIGS = {
    "predicted-latency": """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 262144
- type: predicted-latency-producer
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters:
    affinityThreshold: 0.8
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: latency-scorer
- type: weighted-random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
""",
    "predicted-latency-slo": """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 262144
- type: predicted-latency-producer
  parameters:
    streamingMode: true
- type: prefix-cache-affinity-filter
  name: strict-affinity-filter
  parameters:
    affinityThreshold: 0.99
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters:
    affinityThreshold: 0.8
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
""",
    "predicted-latency-pd": """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: always-disagg-pd-decider
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: always-disagg-pd-decider
- type: prefill-filter
- type: decode-filter
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 131072
- type: predicted-latency-producer
  parameters:
    streamingMode: true
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters:
    affinityThreshold: 0.8
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 5000
- type: latency-scorer
  name: ttft-scorer
  parameters:
    ttftWeight: 1
    tpotWeight: 0
- type: latency-scorer
  name: tpot-scorer
  parameters:
    ttftWeight: 0
    tpotWeight: 1
- type: weighted-random-picker
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: ttft-scorer
  - pluginRef: weighted-random-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: tpot-scorer
  - pluginRef: weighted-random-picker
""",
    "predicted-latency-multimodal": """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
  parameters:
    estimate:
      image:
        mode: dynamic
        defaultResolution:
          width: 1280
          height: 720
        dynamic:
          factor: 1024
- type: approx-prefix-cache-producer
  parameters:
    maxPrefixTokensToMatch: 131072
- type: predicted-latency-producer
- type: prefix-cache-affinity-filter
  name: loose-affinity-filter
  parameters:
    affinityThreshold: 0.6
    ttftSource: latencyPredictor
    maxTTFTPenaltyMs: 30000
- type: latency-scorer
- type: weighted-random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
""",
}
