"""The arithmetic of ``epp bench rate``: arrival schedules, Prometheus histograms, percentiles.

* ``arrivals``: the send times of one rate step, open loop (nothing waits for an answer):
  ``poisson`` draws exponential gaps of mean ``1 / rate`` from a seeded generator (the arrival
  process of inference-perf's constant-rate stages and of most serving benchmarks), ``uniform``
  spaces them exactly ``1 / rate`` apart. Both stop before ``duration`` and never hold more than
  ``MAX_ARRIVALS`` times.
* ``parse_histogram`` reads one histogram family from ``/metrics`` text (``_bucket`` lines
  summed over every label but ``le``, ``_count`` and ``_sum``), ``Histogram.minus`` is what a
  step added (after minus before), and ``Histogram.quantile`` interpolates linearly inside the
  bucket that holds the rank, as Prometheus' ``histogram_quantile`` and llm-d-router's
  ``test/perf/run_nightly_perf.py`` do (the first bucket starts at 0). A rank that falls in the
  ``+Inf`` bucket has no upper bound: ``quantile`` returns ``math.inf`` and the report prints
  ``> <largest bound>``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final

ARRIVAL_KINDS: Final = ("poisson", "uniform")
MAX_ARRIVALS: Final = 1_000_000


def arrivals(rate: float, duration: float, kind: str = "poisson", seed: int = 1) -> list[float]:
    """Send times in seconds from the start of a step of ``duration`` seconds at ``rate``/s."""
    if rate <= 0 or duration <= 0:
        raise ValueError("rate and duration must be > 0")
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVAL_KINDS)}, not {kind!r}")
    if kind == "uniform":
        n = min(MAX_ARRIVALS, math.ceil(rate * duration - 1e-9))
        return [i / rate for i in range(n)]
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate)
    while t < duration and len(out) < MAX_ARRIVALS:
        out.append(t)
        t += rng.expovariate(rate)
    return out


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (``math.inf`` last), the count and the sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float = 0.0
    total: float = 0.0

    def minus(self, before: Histogram) -> Histogram:
        """What was observed between ``before`` and this reading (bucket by bucket)."""
        base = dict(before.buckets)
        return Histogram(
            tuple((le, n - base.get(le, 0.0)) for le, n in self.buckets),
            self.count - before.count,
            self.total - before.total,
        )

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (seconds), linear inside its bucket; ``nan`` when empty."""
        if not 0.0 <= q <= 1.0:
            raise ValueError("q must be in [0, 1]")
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(le):
                    return math.inf
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            lower, below = le, cumulative
        return math.inf

    @property
    def top(self) -> float:
        """The largest finite bucket bound (what a quantile above it is reported against)."""
        finite = [le for le, _ in self.buckets if not math.isinf(le)]
        return max(finite) if finite else 0.0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else math.nan


def _le(labels: str) -> float | None:
    for part in labels.split(","):
        key, _, value = part.partition("=")
        if key.strip() == "le":
            text = value.strip().strip('"')
            return math.inf if text == "+Inf" else float(text)
    return None


def parse_histogram(text: str, name: str) -> Histogram:
    """Family ``name`` of a Prometheus text exposition (zeroes when it is absent)."""
    buckets: dict[float, float] = {}
    count = total = 0.0
    bucket_prefix, count_prefix, sum_prefix = name + "_bucket{", name + "_count", name + "_sum"
    for line in text.splitlines():
        if line.startswith(bucket_prefix):
            labels, _, value = line[len(bucket_prefix) :].rpartition("} ")
            le = _le(labels)
            if le is not None:
                buckets[le] = buckets.get(le, 0.0) + float(value)
        elif line.startswith((count_prefix + " ", count_prefix + "{")):
            count += float(line.rpartition(" ")[2])
        elif line.startswith((sum_prefix + " ", sum_prefix + "{")):
            total += float(line.rpartition(" ")[2])
    return Histogram(tuple(sorted(buckets.items())), count, total)


def format_ms(seconds: float, top: float = math.inf) -> str:
    """Milliseconds with two decimals; ``> <top>`` for a quantile past the largest bound."""
    if math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return f"> {top * 1000:g}"
    return f"{seconds * 1000:.2f}"
