"""Endpoint attributes: typed values the data layer publishes on an endpoint.

Besides the fixed ``Metrics`` fields, extractors publish values in ``Metrics.attributes`` under a
``DataKey`` ``<attribute>/<producer>`` (``Topology/topology-extractor``,
``GPUUtilization/dcgm-extractor``). Filters and scorers read them back from the endpoint snapshot
they are given::

    metrics = with_attribute(previous, GPU_UTILIZATION, 0.42)   # in an extractor
    util = endpoint_attribute(endpoint, GPU_UTILIZATION)        # float | None, in a scorer

The rules:

* values are immutable (numbers, strings, frozen dataclasses): snapshots share them;
* keys are stored as plain strings (``with_attribute`` does it; a ``DataKey`` looks them up as
  its text), so a ``Metrics`` can be copied and pickled;
* an extractor returns a ``Metrics`` derived from the one it was given (``with_attribute``,
  ``dataclasses.replace``), so the keys other extractors published survive;
* publishing an attribute leaves ``update_time`` alone: that field says when the model server's
  own metrics last changed (the freshness saturation detectors check), and an exporter beside the
  model server says nothing about that;
* a missing key means unknown: each consumer applies its own policy (``onMissing``, score 0, ...).

Numeric attributes are upstream's ``ScalarMetricValue``. ``ScalarAttribute.resolve`` turns an
attribute and producer spelled in configuration into a reader: with the producer omitted it reads a
custom metric of ``core-metrics-extractor`` (``Metrics.custom``, keyed by its ``attributeKey``),
otherwise the float that producer published in ``Metrics.attributes``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from epp.plugin.keys import DataKey
from epp.plugin.types import Endpoint, Metrics

T = TypeVar("T")

CORE_METRICS_EXTRACTOR: Final = "core-metrics-extractor"
"""Producer of the custom scalar metrics (``Metrics.custom``)."""

GPU_UTILIZATION: Final[DataKey[float]] = DataKey("GPUUtilization", "dcgm-extractor")
"""Highest utilization of the endpoint's GPUs in [0, 1], published by ``dcgm-extractor`` (the key
names the type, not the instance, as upstream)."""


@dataclass(frozen=True, slots=True)
class ModelData:
    """One model an endpoint serves, as its OpenAI-compatible ``/v1/models`` lists it (upstream's
    ``ModelData``): ``parent`` is the base model of a LoRA adapter (``""`` for a base model)."""

    id: str
    object: str = ""
    created: int = 0
    owned_by: str = ""
    parent: str = ""


SERVED_MODELS: Final[DataKey[tuple[ModelData, ...]]] = DataKey(
    "ModelDataCollection", "models-data-extractor"
)
"""The models an endpoint serves, in the order its ``/v1/models`` lists them, published by
``models-data-extractor`` (the key names the type, not the instance, as upstream; upstream spells
it ``/v1/models/models-data-extractor``)."""


MULTICLUSTER_KV_CACHE_UTILIZATION: Final[DataKey[float]] = DataKey(
    "MultiClusterKVCacheUtilization", "multicluster-metrics-extractor"
)
"""A cluster's aggregate KV-cache utilization in [0, 1] (its pool's average, as its EPP exports
it), published on a cluster endpoint by ``multicluster-metrics-extractor`` (the key names the
type, not the instance, as upstream's producer-less key)."""

MULTICLUSTER_QUEUE_SIZE: Final[DataKey[float]] = DataKey(
    "MultiClusterQueueSize", "multicluster-metrics-extractor"
)
"""A cluster's aggregate waiting-queue size (its pool's average), published on a cluster endpoint
by ``multicluster-metrics-extractor``."""


def endpoint_attribute(endpoint: Endpoint, key: DataKey[T]) -> T | None:
    """The value published on ``endpoint`` under ``key``, or None."""
    metrics = endpoint.metrics
    if metrics is None:
        return None
    return cast("T | None", metrics.attributes.get(key))


def with_attribute(metrics: Metrics, key: DataKey[T], value: T | None) -> Metrics:
    """``metrics`` with ``key`` set to ``value`` (removed when None); the same object when
    nothing changes, so the collector does not store an identical copy."""
    current = metrics.attributes
    if value is None:
        if key not in current:
            return metrics
        return dataclasses.replace(
            metrics, attributes={k: v for k, v in current.items() if k != key}
        )
    if key in current and current[key] == value:
        return metrics
    # Stored under the plain string: a DataKey cannot be deep-copied or unpickled.
    return dataclasses.replace(metrics, attributes={**current, str(key): value})


@dataclass(frozen=True, slots=True)
class ScalarAttribute:
    """A numeric endpoint attribute as configured: an attribute name and its producer."""

    attribute: str
    producer: str

    @property
    def key(self) -> DataKey[float]:
        return DataKey(self.attribute, self.producer)

    @classmethod
    def resolve(cls, attribute: str, producer: str | None, what: str) -> ScalarAttribute:
        """Upstream's ``ResolveConfiguredKey``: a None producer selects
        ``core-metrics-extractor``; any other value (``""`` included) is used verbatim. An
        attribute containing ``/`` with no producer is rejected (``ValueError``) rather than
        guessed at: it is most likely the old combined ``Attribute/Producer`` spelling, which would
        silently match nothing."""
        if producer is not None:
            return cls(attribute, producer)
        head, slash, tail = attribute.rpartition("/")
        if slash:
            raise ValueError(
                f"{what}: attribute {attribute!r} contains '/' but no producer is set. The "
                "attribute and its producer are separate parameters; if this is the combined "
                f'"Attribute/Producer" spelling, split it into attribute: {head!r} and '
                f"producer: {tail!r}. If the attribute name itself contains '/', set producer "
                "explicitly"
            )
        return cls(attribute, CORE_METRICS_EXTRACTOR)

    def read(self, endpoint: Endpoint) -> float | None:
        """The endpoint's value, or None when it has none (or a non-numeric or non-finite one)."""
        metrics = endpoint.metrics
        if metrics is None:
            return None
        value: Any
        if self.producer == CORE_METRICS_EXTRACTOR:
            value = metrics.custom.get(self.attribute)
        else:
            value = metrics.attributes.get(self.key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value) if math.isfinite(value) else None
