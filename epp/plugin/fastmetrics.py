"""``FastHistogram``, ``FastCounter``, ``FastGauge``: ``prometheus_client`` families whose updates
are plain float arithmetic (a histogram's ``observe`` a bisection and two additions), for families
updated only on the App's event loop: the App's own request metrics, and a plugin's that it
updates from its request-path hooks (pass the class as ``metric_family``'s ``kind``).

The stock ``observe`` walks the bucket bounds one by one and takes a lock per bucket increment
and per sum update, and the stock counter and gauge take a lock per update; the request path
observes a few dozen histograms per request and one per streamed chunk, and increments about as
many counters, so that was a tenth of the EPP's CPU per request. Here a child keeps its values as
plain floats: every update of the App's families happens on the App's event loop thread (the
Kubernetes watch threads and ``asyncio.to_thread`` calls update no family), and a scrape, on the
same loop, reads them between two updates.

Exposition is the stock classes' (``_child_samples`` is inherited, reading the values through
``get``): the same buckets, count, sum, values and label sets, which ``tests/unit/observability``
checks against stock families fed the same updates. Exemplars are not supported (upstream's EPP
emits none), nor a gauge's ``mostrecent`` multiprocess mode (it falls back to the stock class).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import Counter, Gauge, Histogram


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


class FastCounter(Counter):
    def _metric_init(self) -> None:
        super()._metric_init()
        self._value = _Value()

    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        if exemplar:
            raise ValueError("FastCounter keeps no exemplars")
        try:
            self._value.value += amount
        except AttributeError:  # the parent of labelled children: as the stock class refuses
            self._raise_if_not_observable()  # type: ignore[no-untyped-call]
            raise


class FastGauge(Gauge):
    def _metric_init(self) -> None:
        super()._metric_init()
        if self._multiprocess_mode not in self._MOST_RECENT_MODES:  # set before this runs
            self._value = _Value()

    def inc(self, amount: float = 1) -> None:
        value = getattr(self, "_value", None)
        if type(value) is not _Value:
            super().inc(amount)  # refused on a parent, or the stock ``mostrecent`` path
        else:
            value.value += amount

    def dec(self, amount: float = 1) -> None:
        self.inc(-amount)

    def set(self, value: float) -> None:
        current = getattr(self, "_value", None)
        if type(current) is not _Value:
            super().set(value)
        else:
            current.value = float(value)
