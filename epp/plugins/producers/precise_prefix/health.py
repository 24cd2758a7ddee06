"""KV-event health metrics of ``precise-prefix-cache-producer``: upstream's ``kv_cache_events_*``
families, each labelled ``plugin_name`` first and then with upstream's labels.

- ``llm_d_epp_kv_cache_events_messages_received_total{pod_identifier}``: messages read off a
  socket (``pod_identifier`` is the endpoint id of a per-endpoint subscription, or the bound URL
  of the central socket);
- ``llm_d_epp_kv_cache_events_zmq_errors_total{pod_identifier, operation}``: socket failures,
  ``operation`` one of ``bind``, ``connect``, ``subscribe``, ``recv``;
- ``llm_d_epp_kv_cache_events_subscriber_reconnections_total{pod_identifier}``: sockets recreated
  after a failure (ZMQ's own transparent reconnects of a live socket are not seen);
- ``llm_d_epp_kv_cache_events_pool_queue_depth`` and ``..._pool_capacity``: messages waiting in
  the worker queues, and the number of workers (``kvEventsConfig.concurrency``);
- ``llm_d_epp_kv_cache_events_stores_skipped_total{cache_kind, reason}``: ``BlockStored`` events
  not indexed: ``unsupported_cache_kind`` (a KV group whose attention kind cannot serve prefix
  matches: sliding window, Mamba, …), and this index's other reasons (``partial_tokens``,
  ``count_mismatch``, ``block_size_mismatch``, ``unknown_parent``, ``unaligned_parent``,
  ``empty``, ``unknown_tier_move``); ``cache_kind`` is the group's kind or ``unknown``;
- ``llm_d_epp_kv_cache_events_removals_skipped_total{cache_kind, reason}``: ``BlockRemoved``
  events of a group never announced (``unknown_group``) or of an unsupported kind;
- ``llm_d_epp_kv_cache_events_dedup_removed_hashes_suppressed_total`` and ``..._forwarded_total``
  (deprecated twins ``kvcache_kvevents_dedup_removed_hashes_*_total``): removed block hashes
  absorbed by a repeated announcement, and those passed on to the index (``index``).

The per-endpoint series go when the endpoint's subscription does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from epp.plugin.metrics import metric_family

_PREFIX: Final = "llm_d_epp_kv_cache_events_"
_DEDUP: Final = {
    "suppressed": "Block hashes whose removal was suppressed by the KV-event dedup filter "
    "(block hashes, not BlockRemoved events)",
    "forwarded": "Block hashes forwarded for eviction after the KV-event dedup filter "
    "(block hashes, not BlockRemoved events)",
}


_POD: Final = ("pod_identifier",)
_SKIP: Final = ("cache_kind", "reason")
# attribute → (kind, name after the prefix, help, labels after plugin_name)
_FAMILIES: Final[dict[str, tuple[type[Any], str, str, tuple[str, ...]]]] = {
    "_messages": (
        Counter,
        "messages_received",
        "Total number of messages received from ZMQ subscribers",
        _POD,
    ),
    "_errors": (
        Counter,
        "zmq_errors",
        "Total number of ZMQ subscriber errors",
        (*_POD, "operation"),
    ),
    "_reconnections": (
        Counter,
        "subscriber_reconnections",
        "Total number of ZMQ subscriber reconnection attempts",
        _POD,
    ),
    "_depth": (
        Gauge,
        "pool_queue_depth",
        "Total number of messages queued across all worker shards",
        (),
    ),
    "_capacity": (
        Gauge,
        "pool_capacity",
        "Number of worker shards (capacity) in the event processing pool",
        (),
    ),
    "_stores": (
        Counter,
        "stores_skipped",
        "Total number of KV-cache store events skipped before prefix indexing",
        _SKIP,
    ),
    "_removals": (
        Counter,
        "removals_skipped",
        "Total number of KV-cache removal events skipped for groups excluded from prefix indexing",
        _SKIP,
    ),
}


class EventHealth:
    """The families of one producer instance, bound to its ``plugin_name`` (``_FAMILIES``: the
    labelled ones, and the children of the unlabelled gauges)."""

    _messages: Any
    _errors: Any
    _reconnections: Any
    _depth: Any
    _capacity: Any
    _stores: Any
    _removals: Any

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self._name = name
        for attr, (kind, metric, doc, labels) in _FAMILIES.items():
            family = metric_family(registry, kind, _PREFIX + metric, doc, ("plugin_name", *labels))
            setattr(self, attr, family if labels else family.labels(name))
        self._dedup = {
            outcome: tuple(
                metric_family(registry, Counter, family, help_, ("plugin_name",)).labels(name)
                for family, help_ in (
                    (f"{_PREFIX}dedup_removed_hashes_{outcome}", doc),
                    (
                        f"kvcache_kvevents_dedup_removed_hashes_{outcome}",
                        f"Deprecated: use {_PREFIX}dedup_removed_hashes_{outcome}_total. {doc}",
                    ),
                )
            )
            for outcome, doc in _DEDUP.items()
        }
        self._pods: dict[str, Any] = {}
        self._error_labels: set[tuple[str, str]] = set()

    def message(self, pod: str) -> None:
        child = self._pods.get(pod)
        if child is None:
            child = self._pods[pod] = self._messages.labels(self._name, pod)
        child.inc()

    def error(self, pod: str, operation: str) -> None:
        self._error_labels.add((pod, operation))
        self._errors.labels(self._name, pod, operation).inc()

    def reconnection(self, pod: str) -> None:
        self._reconnections.labels(self._name, pod).inc()

    def forget(self, pod: str) -> None:
        """``pod``'s subscription is gone: drop its series."""
        for family in (self._messages, self._reconnections):
            with contextlib.suppress(KeyError):
                family.remove(self._name, pod)
        self._pods.pop(pod, None)
        for labels in [lab for lab in self._error_labels if lab[0] == pod]:
            self._error_labels.discard(labels)
            self._errors.remove(self._name, *labels)

    def queue_depth(self, depth: int) -> None:
        self._depth.set(depth)

    def capacity(self, workers: int) -> None:
        self._capacity.set(workers)

    def store_skipped(self, cache_kind: str, reason: str) -> None:
        self._stores.labels(self._name, cache_kind or "unknown", reason).inc()

    def removal_skipped(self, cache_kind: str, reason: str) -> None:
        self._removals.labels(self._name, cache_kind or "unknown", reason).inc()

    def removals(self, forwarded: int, suppressed: int) -> None:
        for outcome, n in (("forwarded", forwarded), ("suppressed", suppressed)):
            if n:
                for child in self._dedup[outcome]:
                    child.inc(n)
