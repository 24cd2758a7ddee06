"""The precise-prefix producer's metrics, labelled ``plugin_name``: index size (blocks and
estimated bytes), KV events applied / skipped / dropped, and messages lost to sequence gaps."""

from __future__ import annotations

from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge

from epp.plugin.metrics import metric_family
from epp.plugins.producers.precise_prefix.index import PreciseIndex

_FAMILIES: Final[dict[str, tuple[type[Any], str, str, tuple[str, ...]]]] = {
    "blocks": (
        Gauge,
        "llm_d_epp_precise_prefix_index_blocks",
        "(endpoint, block) entries in the precise prefix index.",
        (),
    ),
    "bytes": (
        Gauge,
        "llm_d_epp_precise_prefix_index_bytes",
        "Estimated memory of the precise prefix index.",
        (),
    ),
    "applied": (
        Counter,
        "llm_d_epp_kv_events",
        "KV events applied to the index, by event type.",
        ("event",),
    ),
    "skipped": (
        Counter,
        "llm_d_epp_kv_events_skipped",
        "KV events not applied, by reason.",
        ("reason",),
    ),
    "dropped": (
        Counter,
        "llm_d_epp_kv_events_dropped",
        "KV-event messages dropped before decoding, by reason.",
        ("reason",),
    ),
    "lost": (
        Counter,
        "llm_d_epp_kv_events_lost",
        "KV-event messages missing from the publishers' sequence numbers.",
        (),
    ),
}


class IndexMetrics:
    """The producer's families on the App registry, labelled with the plugin name."""

    def __init__(self, registry: CollectorRegistry, name: str) -> None:
        self._name = name
        self._families = {
            key: metric_family(registry, kind, metric, doc, ("plugin_name", *labels))
            for key, (kind, metric, doc, labels) in _FAMILIES.items()
        }

    def count(self, kind: str, label: str = "", n: int = 1) -> None:
        family = self._families[kind]
        (family.labels(self._name, label) if label else family.labels(self._name)).inc(n)

    def size(self, index: PreciseIndex) -> None:
        self._families["blocks"].labels(self._name).set(index.entries)
        self._families["bytes"].labels(self._name).set(index.approx_bytes())
