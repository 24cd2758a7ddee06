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
