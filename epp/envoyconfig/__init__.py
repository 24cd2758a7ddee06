"""``epp envoy-config``: Envoy and Istio configs for this EPP, built from typed Envoy API messages.

``options`` (what to generate) → ``filters`` (the ext_proc filter and its hooks), ``clusters``
(the EPP, the model servers, the fail-open fallback), ``bootstrap`` (listener, routes, a whole
Envoy config), ``istio`` (the EnvoyFilter) → ``render`` (YAML/JSON). A tool: the service never
imports it; the local stack and the benchmarks run their Envoy from it.
"""
