"""Prometheus families of the cross-replica sync loop (``llm_d_epp_state_sync_*``), on the App's
registry. They exist only when a cross-replica syncer is configured.

A table like ``epp.observability.metrics`` (which this layer may not import): one row per family,
``name`` spelled as exposed (counters with ``_total``)."""

from __future__ import annotations

from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge

_PLUGIN: Final = ("plugin_name",)


class MetricSpec(NamedTuple):
    attr: str
    kind: type[Counter] | type[Gauge]
    name: str
    doc: str
    labels: tuple[str, ...] = ()


# Registration order is exposition order.
STATE_SYNC_METRICS: Final = (
    MetricSpec(
        "published_facts",
        Counter,
        "llm_d_epp_state_sync_published_facts_total",
        "Facts this replica published to the other replicas, by plugin",
        _PLUGIN,
    ),
    MetricSpec(
        "applied_facts",
        Counter,
        "llm_d_epp_state_sync_applied_facts_total",
        "Facts of other replicas applied to local state, by plugin",
        _PLUGIN,
    ),
    MetricSpec(
        "apply_seconds",
        Counter,
        "llm_d_epp_state_sync_apply_seconds_total",
        "CPU seconds spent applying other replicas' facts to local state, by plugin",
        _PLUGIN,
    ),
    MetricSpec(
        "batches",
        Counter,
        "llm_d_epp_state_sync_batches_total",
        "Batches published, received and replayed (direction)",
        ("direction",),
    ),
    MetricSpec(
        "skipped_facts",
        Counter,
        "llm_d_epp_state_sync_skipped_facts_total",
        "Facts received but not applied: own_origin (this replica's) or unknown_plugin",
        ("reason",),
    ),
    MetricSpec(
        "errors",
        Counter,
        "llm_d_epp_state_sync_errors_total",
        "Failed operations: publish, receive, replay (the syncer), export, apply (a plugin)",
        ("operation",),
    ),
    MetricSpec(
        "dropped_facts",
        Counter,
        "llm_d_epp_state_sync_dropped_facts_total",
        "Facts dropped unpublished because the outbox was full (oldest first), by plugin",
        _PLUGIN,
    ),
    MetricSpec(
        "outbox_facts",
        Gauge,
        "llm_d_epp_state_sync_outbox_facts",
        "Facts waiting to be published",
    ),
    MetricSpec(
        "lag",
        Gauge,
        "llm_d_epp_state_sync_lag_seconds",
        "Seconds since this replica last read the other replicas' facts",
    ),
    MetricSpec(
        "bootstrapped",
        Gauge,
        "llm_d_epp_state_sync_bootstrapped",
        "1 once the log's tail was replayed at start, 0 before",
    ),
)


class SyncMetrics:
    """One attribute per ``STATE_SYNC_METRICS`` row."""

    published_facts: Counter
    applied_facts: Counter
    apply_seconds: Counter
    batches: Counter
    skipped_facts: Counter
    errors: Counter
    dropped_facts: Counter
    outbox_facts: Gauge
    lag: Gauge
    bootstrapped: Gauge

    def __init__(self, registry: CollectorRegistry) -> None:
        for spec in STATE_SYNC_METRICS:
            family = spec.kind(spec.name, spec.doc, spec.labels, registry=registry)
            setattr(self, spec.attr, family)
