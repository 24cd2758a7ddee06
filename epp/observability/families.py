"""The machinery of the metric tables: ``MetricSpec`` rows, the families they build, the
``_Twin`` that updates a family and its deprecated twin together, and ``EppRegistry``, the App's
registry (``epp.observability.metrics`` holds the table itself)."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator, Sequence
from typing import Any, Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.metrics_core import Metric

from epp.plugin.fastmetrics import FastCounter, FastGauge, FastHistogram

Family = Counter | Gauge | Histogram

# Upstream's bucket bounds, verbatim (32778 included), packed densely rather than one a line.
# fmt: off
_LATENCY_BUCKETS: Final = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30,
    45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)
# not Final: mypyc leaves a Final unset when another module-level Final unpacks it
_SCHED_BUCKETS: tuple[float, ...] = (
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)
_PLUGIN_BUCKETS: Final = (
    0.00001, 0.00002, 0.00005, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1,
)
_TOKEN_BUCKETS: Final = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
    524288, 1048576,
)
_SIZE_BUCKETS: Final = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288,
    1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728,
)
# fmt: on
_NTPOT_BUCKETS: Final = (*_SCHED_BUCKETS, 0.2, 0.5, 1.0)
_TPOT_BUCKETS: Final = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6,
    0.8, 1, 2,
)  # fmt: skip
_ITL_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2,
)  # fmt: skip
_REQUEST_PROCESSING_BUCKETS: Final = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
)  # fmt: skip
_RESPONSE_PROCESSING_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip


_MAX_CACHED: Final = 4096
"""Label sets per family whose children ``_Twin`` keeps."""


class MetricSpec(NamedTuple):
    """One row of a metric table: a family, plus its deprecated twin when upstream emits one.

    ``name`` is the exposed family name (counters spelled with ``_total``). The twin shares kind
    and buckets; its help defaults to ``Deprecated: <name>`` and its labels to ``labels``."""

    attr: str  # attribute of the metrics object that holds the family (or the pair)
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    doc: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None  # histograms only
    twin: str | None = None
    twin_doc: str | None = None
    twin_labels: tuple[str, ...] | None = None


_FAST: dict[type[Any], type[Any]] = {
    Counter: FastCounter,
    Gauge: FastGauge,
    Histogram: FastHistogram,
}


def build_families(spec: MetricSpec, registry: CollectorRegistry) -> list[Family]:
    """Register the row's family, then its twin if any (that order: the wrappers rely on it).
    The families are ``epp.plugin.fastmetrics``' lock-free kinds."""
    kw: dict[str, Any] = {} if spec.buckets is None else {"buckets": spec.buckets}
    kind = _FAST[spec.kind]
    families: list[Family] = [kind(spec.name, spec.doc, spec.labels, registry=registry, **kw)]
    if spec.twin is not None:
        doc = f"Deprecated: {spec.name}" if spec.twin_doc is None else spec.twin_doc
        labels = spec.labels if spec.twin_labels is None else spec.twin_labels
        families.append(kind(spec.twin, doc, labels, registry=registry, **kw))
    return families


class EppRegistry(CollectorRegistry):
    """The App's registry: upstream's exposition has no ``*_created`` series (Go's client has
    none), so they are left out here too; and the ``process_*`` families of this process
    (CPU, memory, file descriptors, start time), as controller-runtime's registry has."""

    def __init__(self) -> None:
        super().__init__()
        ProcessCollector(registry=self)

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if metric.type in ("counter", "histogram", "summary", "gauge"):
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def build_info() -> tuple[str, str]:
    """``(commit, build_ref)`` of the ``info`` gauges: the installed package's version as
    ``build_ref``; ``commit`` from ``$EPP_BUILD_COMMIT`` when the image sets it, else empty."""
    try:
        version = importlib.metadata.version("inference-epp")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return os.environ.get("EPP_BUILD_COMMIT", ""), version


class _Twin:
    """One canonical family plus its deprecated twin; every call updates both.

    The labelled children of each label set are looked up once and kept (a
    ``prometheus_client`` ``labels()`` call costs about twice an ``observe``, and the request
    path updates a few dozen series per request); ``clear`` forgets them with the series. The
    label values reaching here are already bounded (``epp.observability.labels``), and so is
    this cache: past ``_MAX_CACHED`` label sets a new set is looked up each time instead."""

    __slots__ = ("_children", "_metrics")

    def __init__(self, *metrics: Any) -> None:
        self._metrics = metrics
        self._children: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[Any, ...]] = {}

    def _all(self, labels: Sequence[str], twin_labels: Sequence[str]) -> tuple[Any, ...]:
        key = (tuple(labels), tuple(twin_labels))
        found = self._children.get(key)
        if found is None:
            first, *rest = self._metrics
            found = (
                first.labels(*labels) if labels else first,
                *(m.labels(*twin_labels) if twin_labels else m for m in rest),
            )
            if len(self._children) < _MAX_CACHED:
                self._children[key] = found
        return found

    def inc(self, labels: Sequence[str], twin_labels: Sequence[str], amount: float = 1) -> None:
        for child in self._all(labels, twin_labels):
            child.inc(amount)

    def set(self, labels: Sequence[str], twin_labels: Sequence[str], value: float) -> None:
        for child in self._all(labels, twin_labels):
            child.set(value)

    def clear(self) -> None:
        self._children.clear()
        for m in self._metrics:
            m.clear()

    def observe(self, labels: Sequence[str], twin_labels: Sequence[str], value: float) -> None:
        for child in self._all(labels, twin_labels):
            child.observe(value)
