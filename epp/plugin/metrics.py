"""Metric families for plugins, on the App's registry.

Every plugin instance gets its App's one ``CollectorRegistry`` (``Handle.registry``), and
``prometheus_client`` refuses a second registration of a name. A type configured several times
(different names, told apart by a ``plugin_name`` label) must therefore share one family:
``metric_family`` returns the family already registered under ``name``, or creates it.

Example::

    evictions = metric_family(
        handle.registry, Counter, "my_plugin_evictions", "Entries evicted.", ("plugin_name",)
    )
    evictions.labels(self.typed_name.name).inc()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter


def metric_family(
    registry: CollectorRegistry,
    kind: type[Any],
    name: str,
    doc: str,
    labels: Sequence[str] = (),
    **kwargs: Any,
) -> Any:
    """The ``kind`` family ``name`` on ``registry``, created on first use (``kwargs`` such as
    ``buckets`` apply only then)."""
    existing = registry._names_to_collectors.get(name)  # no public lookup exists
    if existing is None and kind is Counter:
        existing = registry._names_to_collectors.get(f"{name}_total")
    if existing is not None:
        return existing
    return kind(name, doc, tuple(labels), registry=registry, **kwargs)
