"""The plugin catalog: every installed type beside llm-d-router's, for ``epp plugins list`` and
docs/plugins.md (``epp plugins list --markdown``; a test keeps that copy equal to it).

``UPSTREAM`` lists the types llm-d-router registers (its ``cmd/epp/runner/runner.go``) with their
stability there. ``NOT_HERE`` says, for each upstream type this EPP does not provide, why not.
The kind of an installed type comes from where it lives (the house rule: a type's folder follows
its name and family), and its stability from the class.
"""

from __future__ import annotations

from typing import Final

from epp.plugin import PluginError, Stability
from epp.plugin.registry import PluginRegistry

UPSTREAM: Final[dict[str, str]] = {
    # scheduling: filters, scorers, pickers, profile handlers, deciders
    "label-selector-filter": "beta", "by-label": "beta, deprecated",
    "by-label-selector": "beta, deprecated", "decode-filter": "beta", "prefill-filter": "beta",
    "encode-filter": "beta", "session-affinity-filter": "alpha",
    "endpoint-attribute-filter": "alpha", "topology-affinity-filter": "alpha",
    "utilization-filter": "alpha", "prefix-cache-affinity-filter": "beta",
    "slo-headroom-tier-filter": "beta", "header-based-testing-filter": "beta",
    "queue-scorer": "beta", "running-requests-size-scorer": "beta",
    "kv-cache-utilization-scorer": "beta", "lora-affinity-scorer": "beta",
    "prefix-cache-scorer": "beta", "load-aware-scorer": "beta", "active-request-scorer": "beta",
    "token-load-scorer": "beta", "session-affinity-scorer": "alpha",
    "no-hit-lru-scorer": "beta", "context-length-aware": "beta",
    "precise-prefix-cache-scorer": "beta", "mm-embeddings-cache-scorer": "beta",
    "latency-scorer": "beta", "endpoint-attribute-scorer": "alpha",
    "header-label-affinity-scorer": "alpha", "topology-affinity-scorer": "alpha",
    "max-score-picker": "beta", "random-picker": "beta", "weighted-random-picker": "beta",
    "single-profile-handler": "beta", "disagg-profile-handler": "beta",
    "pd-profile-handler": "beta, deprecated", "disagg-headers-handler": "beta, deprecated",
    "prefill-header-handler": "beta, deprecated", "data-parallel-profile-handler": "beta",
    "header-profile-handler": "alpha", "prefix-based-pd-decider": "beta",
    "always-disagg-pd-decider": "beta", "always-disagg-multimodal-decider": "beta",
    # request control
    "token-producer": "beta", "tokenizer": "beta, deprecated",
    "approx-prefix-cache-producer": "beta", "precise-prefix-cache-producer": "beta",
    "inflight-load-producer": "beta", "session-id-producer": "beta",
    "mm-embeddings-cache-producer": "beta", "predicted-latency-producer": "beta",
    "burst-prefix-cache-producer": "alpha", "p2p-source-producer": "alpha",
    "probabilistic-admitter": "beta", "latency-slo-admitter": "beta",
    "disaggregatedset-rollout-screener": "alpha", "agent-identity": "alpha",
    "request-attribute-reporter": "beta", "destination-endpoint-served-verifier": "beta",
    # parsers
    "openai-parser": "beta", "anthropic-parser": "beta", "vllmhttp-parser": "beta",
    "sglanghttp-parser": "beta", "vllmgrpc-parser": "beta", "vertexai-parser": "beta",
    "passthrough-parser": "beta",
    # data layer
    "metrics-data-source": "beta", "core-metrics-extractor": "beta",
    "models-data-source": "beta", "models-data-extractor": "beta",
    "topology-extractor": "alpha", "dcgm-data-source": "alpha", "dcgm-extractor": "alpha",
    "k8s-notification-source": "beta", "endpoint-notification-source": "beta",
    "file-discovery": "beta",
    # flow control
    "global-strict-fairness-policy": "beta", "round-robin-fairness-policy": "beta",
    "program-aware-fairness": "beta", "fcfs-ordering-policy": "beta",
    "edf-ordering-policy": "beta", "slo-deadline-ordering-policy": "beta",
    "static-usage-limit-policy": "beta", "priority-holdback-policy": "alpha",
    "soft-reflective-ceiling-policy": "alpha", "sheddable-eviction-filter": "alpha",
    "priority-then-time-eviction-order-policy": "alpha", "concurrency-detector": "beta",
    "utilization-detector": "beta",
    # multi-cluster variants
    "multicluster-approx-prefix-cache-producer": "alpha", "multicluster-file-discovery": "alpha",
    "multicluster-kv-cache-utilization-scorer": "alpha",
    "multicluster-metrics-data-source": "alpha", "multicluster-metrics-extractor": "alpha",
    "multicluster-prefix-cache-scorer": "alpha", "multicluster-queue-scorer": "alpha",
    "multicluster-session-affinity-filter": "alpha",
}  # fmt: skip

NOT_HERE: Final[dict[str, str]] = {}

_KINDS: Final = (
    ("filters.sheddable_eviction:", "flow control / admission"),  # an eviction filter
    ("scorers.", "scorer"),
    ("filters.", "filter"),
    ("epp.plugins.pickers.", "picker"),
    ("epp.plugins.profiles.", "profile handler / decider"),
    ("epp.plugins.parsers.", "parser"),
    ("epp.plugins.producers.", "data producer"),
    ("epp.plugins.sources.", "data source / extractor / discovery"),
    ("epp.plugins.flow.", "flow control / admission"),
    ("epp.plugins.hooks.", "request hook"),
    ("epp.plugins.scoring.", "scorer / filter"),
    ("epp.plugins.sync.", "cross-replica syncer"),
    ("epp.plugins.screeners.", "screener"),
)


def kind_of(target: str) -> str:
    """The family of an entry point target (``module:Class``), from where the module lives."""
    return next((kind for prefix, kind in _KINDS if target.startswith(prefix)), "third-party")


def _stability(registry: PluginRegistry, type_name: str) -> str:
    try:
        stability = getattr(registry.load(type_name), "STABILITY", Stability.BETA)
    except PluginError as exc:
        return f"does not load: {exc}"
    return str(stability.value)


def _upstream(type_name: str) -> str:
    if type_name not in UPSTREAM:
        return "ours"
    return "deprecated alias" if "deprecated" in UPSTREAM[type_name] else "yes"


def render_markdown(registry: PluginRegistry) -> str:
    """The installed types, then the llm-d-router types not provided here and why (or that
    there are none)."""
    lines = ["| type | kind | stability | in llm-d-router |", "|---|---|---|---|"]
    for type_name in registry.types():
        kind = kind_of(registry.info(type_name).target)
        stability = _stability(registry, type_name)
        lines.append(f"| `{type_name}` | {kind} | {stability} | {_upstream(type_name)} |")
    missing = sorted(t for t in UPSTREAM if t not in registry)
    if not missing:
        lines += ["", f"Every one of llm-d-router's {len(UPSTREAM)} types is provided here."]
        return "\n".join(lines) + "\n"
    lines += ["", "| llm-d-router type not provided here | why |", "|---|---|"]
    lines += [f"| `{t}` | {NOT_HERE.get(t, 'not built yet')} |" for t in missing]
    return "\n".join(lines) + "\n"
