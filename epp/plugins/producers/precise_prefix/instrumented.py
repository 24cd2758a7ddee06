"""Index metrics of ``precise-prefix-cache-producer`` (``indexerConfig.kvBlockIndexConfig``).

With ``enableMetrics: true`` the index counts what upstream's instrumented index counts, labelled
``plugin_name``, each under upstream's name and its deprecated alias:

- ``llm_d_epp_kv_cache_index_admissions_total`` (``kvcache_index_admissions_total``): request
  keys stored by ``BlockStored`` events;
- ``llm_d_epp_kv_cache_index_evictions_total`` (``kvcache_index_evictions_total``): engine
  blocks released by ``BlockRemoved`` events;
- ``llm_d_epp_kv_cache_index_lookup_requests_total`` (``kvcache_index_lookup_requests_total``):
  lookups (one per prompt of a request);
- ``llm_d_epp_kv_cache_index_lookup_hits_total`` and ``..._max_pod_hit_count_total``
  (``kvcache_index_*``): per lookup, the longest run of leading blocks one endpoint holds;
- ``llm_d_epp_kv_cache_index_lookup_latency_seconds`` (``kvcache_index_lookup_latency_seconds``).

With ``metricsLoggingInterval`` above zero as well, ``beat`` logs them every interval (upstream's
"metrics beat"). Upstream ignores the interval without ``enableMetrics``; so does this, with a
warning at startup.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Histogram

from epp.plugin.metrics import metric_family
from epp.plugins.producers.precise_prefix.index import Keys, PreciseIndex, SourceKey
from epp.plugins.producers.precise_prefix.params import KVBlockIndexConfig

_COUNTERS: Final = {
    "admissions": ("admissions", "Total number of KV-block admissions"),
    "evictions": ("evictions", "Total number of KV-block evictions"),
    "lookups": ("lookup_requests", "Total number of lookup calls"),
    "hits": ("lookup_hits", "Contiguous prefix blocks matched by the best pod per lookup"),
    "max_pod_hit_count": (
        "max_pod_hit_count",
        "Longest contiguous per-pod prefix chain observed per lookup",
    ),
}
_LATENCY: Final = ("lookup_latency_seconds", "Latency of Lookup calls in seconds")
_NEW: Final = "llm_d_epp_kv_cache_index_"
_OLD: Final = "kvcache_index_"


class IndexCounters:
    """The counters (plain numbers, for the beat log) and their Prometheus families."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self.values: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.latency_count = 0
        self.latency_sum = 0.0
        self._counters = {
            key: tuple(
                metric_family(registry, Counter, f"{prefix}{metric}", doc, ("plugin_name",)).labels(
                    name
                )
                for prefix, doc in ((_NEW, help_), (_OLD, f"Deprecated: use {_NEW}{metric}_total."))
            )
            for key, (metric, help_) in _COUNTERS.items()
        }
        metric, help_ = _LATENCY
        self._latency = tuple(
            metric_family(registry, Histogram, f"{prefix}{metric}", doc, ("plugin_name",)).labels(
                name
            )
            for prefix, doc in ((_NEW, help_), (_OLD, f"Deprecated: use {_NEW}{metric}."))
        )

    def add(self, key: str, n: float) -> None:
        if n:
            self.values[key] += n
            for child in self._counters[key]:
                child.inc(n)

    def observe_lookup(self, best: int, seconds: float) -> None:
        self.add("lookups", 1)
        self.add("hits", best)
        self.add("max_pod_hit_count", best)
        self.latency_count += 1
        self.latency_sum += seconds
        for child in self._latency:
            child.observe(seconds)

    def beat(self) -> Mapping[str, Any]:
        """What upstream's metrics beat logs."""
        v = self.values
        count = self.latency_count
        return {
            "admissions": v["admissions"],
            "evictions": v["evictions"],
            "lookups": v["lookups"],
            "hits": v["hits"],
            "max_pod_hit_count": v["max_pod_hit_count"],
            "latency_count": count,
            "latency_sum": round(self.latency_sum, 6),
            "latency_avg": round(self.latency_sum / count, 6) if count else 0.0,
        }


class InstrumentedIndex(PreciseIndex):
    """A ``PreciseIndex`` that records admissions, evictions and lookups in ``counters``."""

    def __init__(self, capacity: int, owners_per_key: int, counters: IndexCounters) -> None:
        super().__init__(capacity, owners_per_key)
        self.counters = counters

    def add(
        self,
        endpoint: str,
        source: SourceKey,
        pairs: Iterable[tuple[int, Keys]],
        mid: Collection[int] = (),
    ) -> int:
        items = pairs if isinstance(pairs, (list, tuple)) else list(pairs)
        keys = sum(1 if isinstance(k, int) else len(k) for _, k in items)
        self.counters.add("admissions", keys)
        return super().add(endpoint, source, items, mid)

    def remove(self, endpoint: str, source: SourceKey, engine_hashes: Iterable[int]) -> int:
        known = super().remove(endpoint, source, engine_hashes)
        self.counters.add("evictions", known)
        return known

    def match(self, keys: Iterable[int]) -> dict[str, int]:
        start = time.perf_counter()
        result = super().match(keys)
        self.counters.observe_lookup(max(result.values(), default=0), time.perf_counter() - start)
        return result


def build_index(
    cfg: KVBlockIndexConfig, registry: CollectorRegistry, name: str, log: logging.Logger
) -> PreciseIndex:
    """The index ``cfg`` asks for: instrumented with ``enableMetrics``."""
    memory = cfg.in_memory_config
    if cfg.metrics_logging_seconds > 0 and not cfg.enable_metrics:
        log.warning("metricsLoggingInterval has no effect without enableMetrics: true")
    if not cfg.enable_metrics:
        return PreciseIndex(memory.size, memory.pod_cache_size)
    return InstrumentedIndex(memory.size, memory.pod_cache_size, IndexCounters(registry, name))
