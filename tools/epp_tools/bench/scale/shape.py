"""The agents' shape in real tokens and seconds, and how ``epp bench scale`` scales it down.

``AgentShape`` describes one coding agent as llm-d's agentic study (219 production sessions, the
llm-d 1.0 release) reports it, in real tokens: a shared harness prompt (``system_tokens``), a long
context that grows by a tool result and the previous answer every turn, a median main-agent
request of about 195,000 input tokens against 317 output tokens (about 615:1), 96% of turns
reusing at least 90% of their input; sub-agents that fork from the main agent's context;
compaction once the context passes ``compact_at`` (a turn that writes a summary of at most
``output_max`` tokens, the new conversation's start); half the agents on the Responses API; think
time between turns.

``Scaling`` is what this machine can drive: every token count is divided by ``length_factor``
(default 32: a median request of about 6,100 input and 10 output tokens, the same ratio), and a
simulated token stands for ``length_factor`` real ones everywhere, so the engine model keeps real
durations: a decode step takes ``length_factor`` times as long (one step emits what stands for
``length_factor`` real tokens) and prefill runs ``length_factor`` times fewer tokens per second.
Turn durations, think times and the share of agents with a request in flight are therefore the
real ones, in simulated seconds. ``time_scale`` (the simulator's) then runs simulated time slower
than the wall clock (0.5: a simulated second lasts two): the request rate the machine has to
carry is ``time_scale`` times the real one, while the concurrency (live agents, requests in
flight, KV held) is the real one.

The engine model of a pod (real units, before scaling): prefill ``prefill_tokens_per_s``
(200,000 tokens/s, fast on purpose: agents join the benchmark mid-session with their context
already grown, and that first prefill stands for a session that began before the run; in steady
state a turn adds a few thousand tokens and its time is decode), a decode step of
``decode_base_ms`` + ``decode_per_seq_ms`` per running sequence (12 ms + 0.15 ms, a large MoE
model at batch 50: about 20 ms), 16-token KV blocks (of simulated tokens).

Fleet sizing: ``working_set_tokens(n)`` estimates the KV the live agents' contexts hold (each
agent's context when it joins, ``context_median`` lognormal, plus ``growth_allowance`` for what it
adds during the run, plus the harness prompt once); ``fleet_for`` gives the fleet ``kv_factor``
times that at the largest step, spread evenly over ``pods``. The run measures the real working
set (the sum of the live agents' contexts, which the client knows exactly) and reports the ratio
it actually had.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from epp_tools.bench.workloads.spec import FleetSpec

BLOCK_SIZE = 16
"""KV block of the simulated pods, in simulated tokens."""


@dataclass(frozen=True)
class AgentShape:
    """One coding agent in real tokens and simulated seconds (see the module doc)."""

    system_tokens: int = 18_000
    context_median: int = 170_000
    context_sigma: float = 0.25
    context_max: int = 240_000
    tool_median: int = 1_000
    tool_sigma: float = 1.1
    tool_max: int = 40_000
    output_median: int = 317
    output_sigma: float = 1.0
    output_max: int = 8_192
    compact_at: int = 260_000
    compact_tokens: int = 400
    summary_tokens: int = 8_000
    """The summary a compaction turn writes (an answer like any other: at most ``output_max``),
    from which the conversation starts again."""
    think_median_s: float = 6.0
    think_sigma: float = 0.6
    subagent_chance: float = 0.05
    """Chance that a main-agent turn forks a sub-agent."""
    subagent_turns: int = 4
    subtask_tokens: int = 2_000
    responses_share: float = 0.5
    growth_allowance: int = 40_000
    """Tokens a live agent adds during a run, its sub-agents included (fleet sizing only; a 24-agent
    run with 20,000 measured its working set 7% above the estimate)."""

    def context_mean(self) -> float:
        return min(self.context_max, self.context_median * math.exp(self.context_sigma**2 / 2))


@dataclass(frozen=True)
class Scaling:
    length_factor: int = 32
    time_scale: float = 0.5
    prefill_tokens_per_s: float = 200_000.0
    decode_base_ms: float = 12.0
    decode_per_seq_ms: float = 0.15
    max_num_seqs: int = 256

    def __post_init__(self) -> None:
        if self.length_factor < 1:
            raise ValueError("length_factor must be >= 1")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0")

    def tokens(self, real: float) -> int:
        """Simulated tokens standing for ``real`` tokens (at least 1)."""
        return max(1, round(real / self.length_factor))

    def as_json(self) -> dict[str, Any]:
        return {
            "length_factor": self.length_factor,
            "time_scale": self.time_scale,
            "prefill_tokens_per_s_real": self.prefill_tokens_per_s,
            "decode_base_ms_real": self.decode_base_ms,
            "decode_per_seq_ms_real": self.decode_per_seq_ms,
            "block_size": BLOCK_SIZE,
            "block_size_real_tokens": BLOCK_SIZE * self.length_factor,
        }


def working_set_tokens(shape: AgentShape, scaling: Scaling, agents: int) -> int:
    """Estimated KV (simulated tokens) that ``agents`` live agents' contexts hold."""
    per_agent = shape.context_mean() + shape.growth_allowance
    return scaling.tokens(shape.system_tokens) + agents * scaling.tokens(per_agent)


def fleet_for(
    shape: AgentShape, scaling: Scaling, agents: int, pods: int, kv_factor: float
) -> FleetSpec:
    """``pods`` equal pods holding ``kv_factor`` x the working set of ``agents`` agents."""
    if pods < 1 or kv_factor <= 0:
        raise ValueError("pods must be >= 1 and kv_factor > 0")
    kv = kv_factor * working_set_tokens(shape, scaling, agents)
    blocks = max(1, math.ceil(kv / pods / BLOCK_SIZE))
    longest = scaling.tokens(shape.compact_at + shape.tool_max + shape.output_max)
    if blocks * BLOCK_SIZE < longest:
        raise ValueError(f"a pod of {blocks} blocks cannot hold one request of {longest} tokens")
    f = scaling.length_factor
    return FleetSpec(
        pods=pods,
        num_gpu_blocks=blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=scaling.max_num_seqs,
        max_model_len=1 << max(12, math.ceil(math.log2(longest + 64))),
        prefill_tokens_per_s=scaling.prefill_tokens_per_s / f,
        time_scale=scaling.time_scale,
        decode_base_ms=scaling.decode_base_ms * f,
        decode_per_seq_ms=scaling.decode_per_seq_ms * f,
    )
