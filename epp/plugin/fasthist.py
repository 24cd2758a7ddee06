"""``FastHistogram``: a ``prometheus_client`` histogram whose ``observe`` costs a bisection and two
additions, for families observed only on the App's event loop (the App's own request metrics,
and a plugin's that it observes from its request-path hooks: pass it as ``metric_family``'s
``kind``).

The stock ``observe`` walks the bucket bounds one by one and takes a lock per bucket increment
and per sum update; the request path observes a few dozen histograms per request and one per
streamed chunk, so that was a tenth of the EPP's CPU per request. Here a child keeps its bucket
counts and its sum as plain floats: every observation of the App's families happens on the App's
event loop thread (the Kubernetes watch threads and ``asyncio.to_thread`` calls update no
histogram), and a scrape, on the same loop, reads them between two observations.

Exposition is the stock class's (``_child_samples`` is inherited, reading the values through
``get``): the same buckets, count, sum and label sets, which ``tests/unit/observability`` checks
against a stock ``Histogram`` fed the same observations. Exemplars are not supported (upstream's
EPP emits none).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import Histogram


class _Value:
    """One float, updated in place (the stock value class's interface, without its lock)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float) -> None:
        self.value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self.value = value

    def get(self) -> float:
        return self.value

    def set_exemplar(self, exemplar: Any) -> None:
        raise ValueError("FastHistogram keeps no exemplars")

    def get_exemplar(self) -> None:
        return None


class FastHistogram(Histogram):
    def _metric_init(self) -> None:
        super()._metric_init()  # the stock values, replaced: ``_created`` and names stay
        self._sum = _Value()
        self._buckets = [_Value() for _ in self._upper_bounds]
        self._bounds = tuple(self._upper_bounds)

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar:
            raise ValueError("FastHistogram keeps no exemplars")
        try:
            bucket = self._buckets[bisect_left(self._bounds, amount)]
        except AttributeError:  # the parent of labelled children: as the stock class refuses
            self._raise_if_not_observable()  # type: ignore[no-untyped-call]
            raise
        bucket.value += 1
        self._sum.value += amount
