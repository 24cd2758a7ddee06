"""The benchmark workloads, seeded and reproducible, each at a ``default`` and a ``full`` scale.

(a) ``shared-prefix``: ``groups`` long system prompts, each shared by ``users`` users who ask their
    own question (one request each, in a seeded random order, closed loop). The fleet holds
    about half of the prompts per pod: a router that keeps each group on one pod hits, one that
    spreads every group over every pod evicts.
(b) ``agentic``: coding-agent sessions, half of them on the Responses API
    (``previous_response_id`` follow-ups), see ``epp_tools.bench.workloads.agentic``.
(b-foreign) ``agentic-foreign-load``: the sessions of (b) on the same fleet with batches of
    ``FOREIGN_MAX_NUM_SEQS`` sequences, while pod-0 is kept busy (its batch full and about 10
    requests waiting) by requests the driver sends straight to its port, which the router never
    sees (``epp_tools.bench.runner.foreign``): the report says how much of the target's traffic
    still went to the busy pod.
(b-pressure) ``agentic-kv-pressure``: agent sessions with sub-agents forking from their
    parent's context, compaction turns and one-shot requests, on a fleet whose KV is 1.6x the
    hot set with pod-0 at 0.4x the others' KV, see ``epp_tools.bench.workloads.pressure``.
(c) ``multi-lora``: ``adapters`` LoRA adapters with Zipf-distributed popularity, each with a few
    system prompts of its own; every pod serves every adapter but only ``max_loras`` at a time
    in a batch (requests for a third adapter wait for a slot). Prefix blocks never match across
    adapters. The EPP adds ``lora-affinity-scorer`` (weight 2) to its default profile.
(d) ``overload``: the fleet at 2x its capacity with three InferenceObjectives (latency-sensitive
    10, agentic 0 from two tenants sending 10:1 in bursts, batch -1), open-loop, real time; see
    ``epp_tools.bench.workloads.overload`` for the classes and how the capacity is derived.
(e) ``long-prompts``: disaggregated prefill/decode against aggregated serving. Unique long
    prompts (a document and a question, nothing to reuse) with long answers, and a fifth of short
    chat prompts, arriving open-loop (Poisson) at 65% of the prefill capacity of two pods. The
    ``epp`` target serves them aggregated on four ``both`` pods; ``epp-pd`` runs
    ``deploy/configs/pd.yaml`` on the same four pods as two prefill and two decode pods (added to
    a run without ``--targets``). See "When P/D pays" below.

When P/D pays (what (e) shows, within what the simulator models): a pod that prefills a long
prompt stalls every sequence it is decoding for the whole prefill (the simulator, like vLLM
without chunked prefill, runs it in one step), so aggregated pods serving long prompts give their
running requests an uneven, slower inter-token latency; decode pods that never prefill keep it
flat (lower ITL p50 and, more so, p90). The price is time to first token: the prompt waits for one
of fewer prefill pods, and its KV moves to the decode pod (``kv_transfer_ms_per_block``, ~80 ms for
16k tokens by default, small next to the ~1 s prefill). So P/D pays when prompts are long and
uncached, answers are long enough that ITL matters (decode-heavy pods), the prefill pool is sized
to the prefill demand (one prefill pod of four in (e) would queue without end), and the transfer
is cheap against the prefill. It does not pay for short or cached prompts (the decider keeps them
on the decode pod: the hop and transfer would cost more than the prefill), nor when TTFT is the
only goal. Throughput is about the same while the fleet is not saturated.

Arrival times are in simulated seconds: ``--time-scale`` speeds them up together with the
simulator, so the offered load relative to the fleet stays the same.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from epp_tools.bench.workloads.agentic import AGENTIC_SHAPES, build_agentic
from epp_tools.bench.workloads.overload import build_overload
from epp_tools.bench.workloads.pressure import PRESSURE_SHAPES, build_pressure
from epp_tools.bench.workloads.spec import (
    MODEL,
    BenchRequest,
    FleetSpec,
    ForeignLoad,
    Message,
    Workload,
)
from epp_tools.bench.workloads.text import words

SCALES = ("default", "full")
WORKLOADS: dict[str, str] = {
    "a": "shared-prefix",
    "b": "agentic",
    "b-foreign": "agentic-foreign-load",
    "b-pressure": "agentic-kv-pressure",
    "c": "multi-lora",
    "d": "overload",
    "e": "long-prompts",
}
FOREIGN_MAX_NUM_SEQS = 8
"""Batch size of every pod in (b-foreign): the busy pod queues beyond it."""


@dataclass(frozen=True)
class PromptMix:
    """Requests made of a shared system prompt and a private question."""

    prompts: int
    system_tokens: int
    question_median: int
    output_tokens: int
    requests: int


def _question(rng: random.Random, median: int) -> str:
    n = max(4, round(rng.lognormvariate(math.log(median), 0.4)))
    return words(rng, n)


def _zipf_weights(n: int) -> list[float]:
    return [1.0 / (k + 1) for k in range(n)]


def shared_prefix(scale: str, seed: int) -> Workload:
    full = scale == "full"
    groups, users = (48, 10) if full else (16, 24)
    system, question, out = (9500, 500, 256) if full else (3000, 150, 32)
    rng = random.Random(seed)
    prompts = [words(rng, system) for _ in range(groups)]
    requests: list[BenchRequest] = []
    for g in range(groups):
        for u in range(users):
            messages: tuple[Message, ...] = (
                {"role": "system", "content": prompts[g]},
                {"role": "user", "content": _question(rng, question)},
            )
            requests.append(BenchRequest(f"g{g}-u{u}", 0, MODEL, messages, out))
    rng.shuffle(requests)
    demand = groups * (system + question)
    fleet = FleetSpec(pods=4, num_gpu_blocks=2 * demand // 4 // 16, max_model_len=32768)
    return Workload(
        name="a",
        title="shared system prompts",
        description=(
            f"{groups} system prompts of {system} tokens, each shared by {users} users asking "
            f"a ~{question}-token question; {out} output tokens; closed loop"
        ),
        requests=requests,
        fleet=fleet,
        concurrency=32 if full else 16,
        shape={"groups": groups, "users_per_group": users, "system_tokens": system},
    )


def agentic(scale: str, seed: int) -> Workload:
    shape = AGENTIC_SHAPES[scale]
    full = scale == "full"
    # about twice a pod's share of the sessions' final contexts: affinity fits, scattering evicts
    final_context = 300_000 if full else 36_000
    blocks = 2 * shape.sessions * final_context // 4 // 16
    fleet = FleetSpec(pods=4, num_gpu_blocks=blocks, max_model_len=524_288 if full else 131_072)
    return build_agentic(shape, seed, fleet, concurrency=shape.sessions)


def agentic_foreign(scale: str, seed: int) -> Workload:
    workload = agentic(scale, seed)
    foreign = ForeignLoad(pod=0, waiting=10, prompt_words=200, max_tokens=512)
    workload.name = "b-foreign"
    workload.title = "agentic sessions beside foreign load"
    workload.description += (
        f"; pod-0 kept busy by requests the router never sees ({FOREIGN_MAX_NUM_SEQS} + "
        f"{foreign.waiting} in flight, {foreign.max_tokens} output tokens each: its batch full "
        f"and about {foreign.waiting} waiting)"
    )
    workload.fleet = replace(workload.fleet, max_num_seqs=FOREIGN_MAX_NUM_SEQS)
    workload.foreign = foreign
    return workload


def agentic_pressure(scale: str, seed: int) -> Workload:
    return build_pressure(PRESSURE_SHAPES[scale], seed)


def multi_lora(scale: str, seed: int) -> Workload:
    full = scale == "full"
    adapters = [f"lora-{i}" for i in range(16 if full else 8)]
    mix = PromptMix(
        prompts=2,
        system_tokens=6000 if full else 2000,
        question_median=300 if full else 100,
        output_tokens=128 if full else 32,
        requests=640 if full else 320,
    )
    rng = random.Random(seed)
    systems = {a: [words(rng, mix.system_tokens) for _ in range(mix.prompts)] for a in adapters}
    weights = _zipf_weights(len(adapters))
    requests: list[BenchRequest] = []
    for i in range(mix.requests):
        adapter = rng.choices(adapters, weights)[0]
        messages: tuple[Message, ...] = (
            {"role": "system", "content": rng.choice(systems[adapter])},
            {"role": "user", "content": _question(rng, mix.question_median)},
        )
        requests.append(BenchRequest(f"r{i}", 0, adapter, messages, mix.output_tokens))
    demand = len(adapters) * mix.prompts * mix.system_tokens
    fleet = FleetSpec(
        pods=4,
        num_gpu_blocks=2 * demand // 4 // 16,
        max_model_len=32768,
        lora_adapters=tuple(adapters),
        max_loras=2,
    )
    return Workload(
        name="c",
        title="multi-LoRA",
        description=(
            f"{len(adapters)} LoRA adapters (Zipf popularity, 2 slots per pod), "
            f"{mix.prompts} system prompts of {mix.system_tokens} tokens per adapter; "
            f"{mix.output_tokens} output tokens; closed loop"
        ),
        requests=requests,
        fleet=fleet,
        concurrency=32 if full else 16,
        epp_extra_scorers=(("lora-affinity-scorer", 2),),
        shape={"adapters": len(adapters), "max_loras": 2},
    )


def overload(scale: str, seed: int) -> Workload:
    return build_overload(scale, seed)


PD_ROLES = ("prefill", "prefill", "decode", "decode")
"""The P/D fleet of (e): the four pods of the aggregated fleet, two of each role."""
PD_LOAD = 0.65
"""Offered prefill load of (e), a share of its P/D fleet's prefill capacity."""


def long_prompts(scale: str, seed: int) -> Workload:
    full = scale == "full"
    n, long_tokens, out = (240, 16000, 1024) if full else (120, 8000, 512)
    short_tokens, short_share = 300, 0.2
    fleet = FleetSpec(pods=4, max_model_len=131072)
    prefill_pods = PD_ROLES.count("prefill")
    mean_prompt = (1 - short_share) * long_tokens + short_share * short_tokens
    rate = PD_LOAD * prefill_pods * fleet.prefill_tokens_per_s / mean_prompt
    rng = random.Random(seed)
    requests: list[BenchRequest] = []
    at = 0.0
    for i in range(n):
        at += rng.expovariate(rate)
        size = short_tokens if rng.random() < short_share else long_tokens
        messages: tuple[Message, ...] = ({"role": "user", "content": words(rng, size)},)
        requests.append(BenchRequest(f"r{i}", 0, MODEL, messages, out, at=at))
    return Workload(
        name="e",
        title="long prompts, P/D against aggregated",
        description=(
            f"{n} unique prompts ({1 - short_share:.0%} of {long_tokens} tokens, the rest of "
            f"{short_tokens}), {out} output tokens, open-loop Poisson arrivals at {rate:.2f}/s "
            f"({PD_LOAD:.0%} of the prefill capacity of {prefill_pods} pods); P/D targets run on "
            f"the same pods as {', '.join(PD_ROLES)}"
        ),
        requests=requests,
        fleet=fleet,
        concurrency=256,
        shape={"long_tokens": long_tokens, "short_share": short_share, "rate_per_s": rate},
        pd_roles=PD_ROLES,
        extra_targets=("epp-pd",),
    )


_BUILDERS: dict[str, Callable[[str, int], Workload]] = {
    "a": shared_prefix,
    "b": agentic,
    "b-foreign": agentic_foreign,
    "b-pressure": agentic_pressure,
    "c": multi_lora,
    "d": overload,
    "e": long_prompts,
}


def resolve(name: str) -> str:
    """Workload key (``a``, ``b``, ``b-foreign``, ...) from a key or a long name."""
    key = name.strip().lower()
    for k, long_name in WORKLOADS.items():
        if key in (k, long_name):
            return k
    known = ", ".join(f"{k} ({v})" for k, v in WORKLOADS.items())
    raise ValueError(f"unknown workload {name!r} (known: {known})")


def build(name: str, *, scale: str = "default", seed: int = 1, time_scale: float = 0.0) -> Workload:
    """Workload ``name`` at ``scale``; ``time_scale`` > 0 overrides the fleet's own."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r} (known: {', '.join(SCALES)})")
    workload = _BUILDERS[resolve(name)](scale, seed)
    if time_scale > 0:
        workload.fleet = replace(workload.fleet, time_scale=time_scale)
    return workload
