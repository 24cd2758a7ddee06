"""``FastHistogram``, ``FastCounter`` and ``FastGauge`` expose exactly what the stock
``prometheus_client`` families do for the same updates (buckets, count, sum, values, label sets),
and refuse what the stock classes refuse."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from epp.plugin.fastmetrics import FastCounter, FastGauge, FastHistogram

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


def _families(stock: type[Any], fast: type[Any], labels: tuple[str, ...]) -> list[Any]:
    out = []
    for kind in (stock, fast):
        registry = CollectorRegistry(auto_describe=True)
        out.append((registry, kind("x", "doc", labels, registry=registry)))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_counters_and_gauges_expose_what_the_stock_ones_do(seed: int) -> None:
    rng = random.Random(seed)
    (c_reg, c), (fc_reg, fc) = _families(Counter, FastCounter, ("a",))
    (g_reg, g), (fg_reg, fg) = _families(Gauge, FastGauge, ("a",))
    for _ in range(500):
        label, amount = rng.choice("xyz"), rng.choice([0, 1, 2.5, rng.random()])
        for counter in (c, fc):
            counter.labels(label).inc(amount)
        op = rng.choice(["inc", "dec", "set"])
        value = amount if op != "set" else rng.uniform(-5, 5)
        for gauge in (g, fg):
            getattr(gauge.labels(label), op)(value)
    assert _exposed(fc_reg) == _exposed(c_reg)
    assert _exposed(fg_reg) == _exposed(g_reg)
    (u_reg, u), (fu_reg, fu) = _families(Counter, FastCounter, ())
    u.inc()
    fu.inc()
    assert _exposed(fu_reg) == _exposed(u_reg)


def test_counters_and_gauges_refuse_what_the_stock_ones_refuse() -> None:
    ((_, counter),) = _families(Counter, FastCounter, ("a",))[1:]
    ((_, gauge),) = _families(Gauge, FastGauge, ("a",))[1:]
    for update in (counter.inc, gauge.inc, gauge.dec, lambda: gauge.set(1)):
        with pytest.raises(ValueError):
            update()  # a labelled parent
    with pytest.raises(ValueError):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("x").inc(1, {"trace_id": "t"})


def test_a_most_recent_gauge_keeps_the_stock_behaviour() -> None:
    registry = CollectorRegistry(auto_describe=True)
    gauge = FastGauge("x", "doc", registry=registry, multiprocess_mode="mostrecent")
    gauge.set(3)
    with pytest.raises(RuntimeError):
        gauge.inc()
    assert "x 3.0" in _exposed(registry)
