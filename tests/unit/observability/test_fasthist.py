"""``FastHistogram`` exposes exactly what a stock ``prometheus_client`` histogram does for the
same observations (buckets, count, sum, label sets), and refuses what the stock class refuses."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from epp.plugin.fasthist import FastHistogram

BOUNDS = (0.001, 0.005, 0.01, 0.1, 1.0, 10.0)


def _pair(labels: tuple[str, ...]) -> tuple[tuple[CollectorRegistry, Histogram], ...]:
    out = []
    for kind in (Histogram, FastHistogram):
        registry = CollectorRegistry(auto_describe=True)
        out.append((registry, kind("x_seconds", "doc", labels, registry=registry, buckets=BOUNDS)))
    return tuple(out)


def _exposed(registry: CollectorRegistry) -> list[str]:
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_exposition_matches_the_stock_histogram(seed: int) -> None:
    rng = random.Random(seed)
    (stock_reg, stock), (fast_reg, fast) = _pair(("a",))
    values = [*BOUNDS, 0.0, 1e9, *(rng.expovariate(3.0) for _ in range(500))]
    for v in values:
        label = rng.choice("xyz")
        stock.labels(label).observe(v)
        fast.labels(label).observe(v)
    assert _exposed(fast_reg) == _exposed(stock_reg)


def test_an_unlabelled_family_and_its_bounds_edges() -> None:
    (stock_reg, stock), (fast_reg, fast) = _pair(())
    for v in (0.001, math.nextafter(0.001, 1), 10.0, 10.5, -1.0):  # a bound falls in its own bucket
        stock.observe(v)
        fast.observe(v)
    assert _exposed(fast_reg) == _exposed(stock_reg)
    assert 'x_seconds_bucket{le="0.001"} 2.0' in _exposed(fast_reg)  # -1.0 and 0.001


def test_a_labelled_parent_and_exemplars_are_refused() -> None:
    ((_, fast),) = _pair(("a",))[1:]
    with pytest.raises(ValueError):
        fast.observe(1.0)
    with pytest.raises(ValueError):
        fast.labels("x").observe(1.0, {"trace_id": "t"})
    fast.labels("x").observe(1.0)
    fast.clear()
    assert 'x_seconds_count{a="x"}' not in "\n".join(_exposed(_pair(("a",))[1][0]))
