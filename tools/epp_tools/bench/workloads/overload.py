"""Workload (d): a simulated fleet at twice its capacity, three traffic classes, two tenants.

Classes (each an InferenceObjective the EPP loads from a generated ``--objectives-file``):

==================  ========  =============================================================
objective           priority  requests
==================  ========  =============================================================
latency-sensitive   10        a fresh ~600-token question (nothing cached), 24 output tokens;
                              Poisson arrivals
agentic             0         one of the tenant's 4 agent prompts (1200 tokens, cached) + a
                              ~60-token step, 80 output tokens; bursts (an agent fanning out
                              tool calls; one agent prompt per burst) from two tenants in
                              ``x-llm-d-inference-fairness-id``: ``tenant-a`` sends exactly 10x
                              as many requests as ``tenant-b``
batch               -1        one of 2 shared instructions (400 tokens, cached) + a ~40-token
                              item, 96 output tokens; Poisson arrivals
==================  ========  =============================================================

Fleet capacity comes from the simulator's engine model (``epp_tools.sim.engine``): a pod runs steps
of ``(decode_base_ms + decode_per_seq_ms * batch) / 1000 + new prefill tokens / prefill rate``
seconds and every running sequence gains one token per step. With the batch full (``S =
max_num_seqs``), a request with ``O`` output tokens and ``P`` uncached prompt tokens therefore
costs its pod::

    cost(r) = O * (decode_base_ms + decode_per_seq_ms * S) / 1000 / S + P / prefill_rate

seconds (its share of ``O`` full steps, plus the prefill every sequence of the batch waits for).
The shared prefixes count as cached (the runner warms them on every pod first). A fleet of
``pods`` pods serves ``pods`` pod-seconds per second, so class ``c`` offered at ``rate_c`` uses
``load_c = rate_c * mean cost_c / pods`` of the fleet; the rates are set so that the loads are
0.2 (latency-sensitive), 0.9 (agentic) and 0.9 (batch): 2.0x the capacity in all.
``overload_factor`` recomputes it from the generated requests.

Arrivals: for ``LEAD_IN_S + duration`` seconds; the requests of the lead-in take the fleet
from idle to saturated and are left out of the statistics (``Workload.measure_from``): in the
first second the pods fill unevenly and the count-based balancing of the default profile sends
every fresh prompt to the emptiest pod, where their prefills queue behind each other, a
transient of the empty fleet rather than of the overload. Each class (each tenant) has a fixed
number of requests ``n = round(rate * (LEAD_IN_S + duration))``; they come in bursts (sizes
geometric with mean ``burst_mean``, gaps within a burst exponential with mean ``burst_gap_s``)
whose start times are uniform over the window, i.e. a Poisson process of bursts conditioned on
its count (``burst_mean`` 1: plain Poisson arrivals).
Everything is drawn from one seeded generator.

The engine is slower than the simulator's default (20 ms decode steps, 4000 prefill tokens/s,
8 sequences per pod): the fleet then streams about 1,500 tokens/s at full batch, which a 2-core
machine relays through Envoy and the EPP without the router becoming the bottleneck.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec, Message, Workload
from epp_tools.bench.workloads.text import message_tokens, prompt_tokens, words

OVERLOAD_FACTOR = 2.0


@dataclass(frozen=True)
class TrafficClass:
    objective: str
    priority: int
    load: float
    """Offered load in units of the fleet's capacity."""
    prefix_tokens: int
    """Words of each shared system prompt (0: none); cached on every pod."""
    prefixes: int
    unique_median: int
    unique_sigma: float
    output_tokens: int
    burst_mean: float = 1.0
    burst_gap_s: float = 0.0
    tenants: tuple[tuple[str, int], ...] = ()
    """Fairness ids and their relative request counts (empty: no fairness id)."""


CLASSES: tuple[TrafficClass, ...] = (
    TrafficClass("latency-sensitive", 10, 0.2, 0, 0, 600, 0.25, 24),
    TrafficClass(
        "agentic",
        0,
        0.9,
        1200,
        4,
        60,
        0.5,
        80,
        burst_mean=6.0,
        burst_gap_s=0.05,
        tenants=(("tenant-a", 10), ("tenant-b", 1)),
    ),
    TrafficClass("batch", -1, 0.9, 400, 2, 40, 0.5, 96),
)
DURATION_S = {"default": 30.0, "full": 90.0}
LEAD_IN_S = 2.0
FLEET = FleetSpec(
    pods=4,
    num_gpu_blocks=2000,
    max_num_seqs=8,
    max_model_len=16384,
    prefill_tokens_per_s=4000.0,
    time_scale=1.0,
    decode_base_ms=20.0,
    decode_per_seq_ms=0.08,
)


def request_cost(fleet: FleetSpec, output_tokens: int, uncached_tokens: int) -> float:
    """Pod-seconds one request uses on a full batch (see the module doc)."""
    step = (fleet.decode_base_ms + fleet.decode_per_seq_ms * fleet.max_num_seqs) / 1000.0
    return output_tokens * step / fleet.max_num_seqs + uncached_tokens / fleet.prefill_tokens_per_s


def _cached_tokens(prefix_words: int, block_size: int) -> int:
    """Prompt tokens served from the cache: the full blocks of the shared system message."""
    if not prefix_words:
        return 0
    return message_tokens("system", prefix_words) // block_size * block_size


def _uncached(c: TrafficClass, unique_words: int, block_size: int) -> int:
    parts = [("user", unique_words)]
    if c.prefix_tokens:
        parts.insert(0, ("system", c.prefix_tokens))
    return prompt_tokens(parts) - _cached_tokens(c.prefix_tokens, block_size)


def mean_cost(c: TrafficClass, fleet: FleetSpec) -> float:
    """Expected pod-seconds per request of class ``c`` (lognormal mean of the fresh part)."""
    mean_unique = round(c.unique_median * math.exp(c.unique_sigma**2 / 2))
    return request_cost(fleet, c.output_tokens, _uncached(c, mean_unique, fleet.block_size))


def class_rate(c: TrafficClass, fleet: FleetSpec) -> float:
    """Requests per second that offer ``c.load`` of the fleet's capacity."""
    return c.load * fleet.pods / mean_cost(c, fleet)


def fleet_capacity(fleet: FleetSpec, classes: Sequence[TrafficClass] = CLASSES) -> float:
    """Requests per second the fleet serves with the classes mixed in proportion to their load."""
    rates = [class_rate(c, fleet) for c in classes]
    cost = sum(r * mean_cost(c, fleet) for r, c in zip(rates, classes, strict=True))
    return fleet.pods * sum(rates) / cost


def _bursts(rng: random.Random, n: int, c: TrafficClass, duration: float) -> list[list[float]]:
    """``n`` arrival times in bursts (see the module doc), burst by burst in start order."""
    sizes: list[int] = []
    p = 1.0 / max(1.0, c.burst_mean)
    while sum(sizes) < n:  # bounded: every burst has at least one request
        size = 1 + (int(math.log(1.0 - rng.random()) / math.log(1.0 - p)) if p < 1 else 0)
        sizes.append(min(size, n - sum(sizes)))
    bursts: list[list[float]] = []
    starts = sorted(rng.uniform(0.0, duration) for _ in sizes)
    for start, size in zip(starts, sizes, strict=True):
        times = [start]
        for _ in range(size - 1):
            gap = rng.expovariate(1.0 / c.burst_gap_s) if c.burst_gap_s > 0 else 0.0
            times.append(times[-1] + gap)
        bursts.append(times)
    return bursts


def _counts(c: TrafficClass, total: int) -> list[tuple[str, int]]:
    """Requests per fairness id: exactly in proportion to the tenants' weights."""
    if not c.tenants:
        return [("", total)]
    unit = max(1, round(total / sum(w for _, w in c.tenants)))
    return [(tenant, unit * w) for tenant, w in c.tenants]


def _unique_words(rng: random.Random, c: TrafficClass) -> int:
    return max(4, round(rng.lognormvariate(math.log(c.unique_median), c.unique_sigma)))


def build_overload(scale: str, seed: int, fleet: FleetSpec = FLEET) -> Workload:
    duration = LEAD_IN_S + DURATION_S[scale]
    rng = random.Random(seed)
    prefixes: dict[tuple[str, str, int], str] = {}
    planned: list[tuple[float, TrafficClass, str, int]] = []
    for c in CLASSES:
        for tenant, n in _counts(c, round(class_rate(c, fleet) * duration)):
            for k in range(c.prefixes):
                prefixes[(c.objective, tenant, k)] = words(rng, c.prefix_tokens)
            for times in _bursts(rng, n, c, duration):
                k = rng.randrange(c.prefixes) if c.prefixes else 0
                planned += [(t, c, tenant, k) for t in times]
    planned.sort(key=lambda p: p[0])
    requests: list[BenchRequest] = []
    for i, (t, c, tenant, k) in enumerate(planned):
        question = words(rng, _unique_words(rng, c))
        messages: tuple[Message, ...] = ({"role": "user", "content": question},)
        if c.prefix_tokens:
            messages = (
                {"role": "system", "content": prefixes[(c.objective, tenant, k)]},
                *messages,
            )
        requests.append(
            BenchRequest(
                f"{c.objective}-{i}", 0, MODEL, messages, c.output_tokens, at=round(t, 4),
                objective=c.objective, fairness_id=tenant,
            )
        )  # fmt: skip
    warm = tuple(
        ({"role": "system", "content": text}, {"role": "user", "content": "warm "})
        for text in prefixes.values()
    )
    return Workload(
        name="d",
        title="overload: priorities, tenants, shedding",
        description=_describe(fleet, duration),
        requests=requests,
        fleet=fleet,
        concurrency=1024,
        shape=_shape(requests, fleet, duration),
        objectives=tuple((c.objective, c.priority) for c in CLASSES),
        warm_prefixes=warm,
        reference_objective=CLASSES[0].objective,
        measure_from=LEAD_IN_S,
    )


def overload_factor(requests: Sequence[BenchRequest], fleet: FleetSpec, duration: float) -> float:
    """Offered pod-seconds per second of the generated requests / the fleet's pods."""
    by_name = {c.objective: c for c in CLASSES}
    total = 0.0
    for r in requests:
        c = by_name[r.objective]
        unique = len(r.messages[-1]["content"]) // 4
        total += request_cost(fleet, r.max_tokens, _uncached(c, unique, fleet.block_size))
    return total / duration / fleet.pods


def _shape(
    requests: Sequence[BenchRequest], fleet: FleetSpec, duration: float
) -> dict[str, object]:
    per_class = {c.objective: sum(r.objective == c.objective for r in requests) for c in CLASSES}
    tenants: dict[str, int] = {}
    for r in requests:
        if r.fairness_id:
            tenants[r.fairness_id] = tenants.get(r.fairness_id, 0) + 1
    return {
        "duration_s": duration,
        "capacity_req_per_s": round(fleet_capacity(fleet), 3),
        "offered_req_per_s": round(len(requests) / duration, 3),
        "overload_factor": round(overload_factor(requests, fleet, duration), 3),
        "classes": {
            c.objective: {
                "priority": c.priority,
                "requests": per_class[c.objective],
                "rate_per_s": round(class_rate(c, fleet), 3),
                "load": c.load,
                "cost_ms": round(mean_cost(c, fleet) * 1000.0, 1),
            }
            for c in CLASSES
        },
        "tenants": tenants,
    }


def _describe(fleet: FleetSpec, duration: float) -> str:
    parts = ", ".join(f"{c.objective} (priority {c.priority}) {c.load:g}" for c in CLASSES)
    return (
        f"open-loop arrivals for {duration:g} s (the first {LEAD_IN_S:g} s, while the fleet fills "
        f"up, not measured) at {OVERLOAD_FACTOR:g}x the fleet's capacity of "
        f"{fleet_capacity(fleet):.1f} req/s ({fleet.pods} pods x {fleet.max_num_seqs} sequences, "
        f"{fleet.decode_base_ms:g} ms decode steps, prefill {fleet.prefill_tokens_per_s:g} "
        "tokens/s; see tools/epp_tools/bench/workloads/overload.py); load per class in capacity "
        f"units: {parts}; "
        "agentic from tenant-a and tenant-b (10:1, bursts of ~6) in x-llm-d-inference-fairness-id"
    )
