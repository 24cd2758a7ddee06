"""Workload (b-pressure): agent sessions under KV pressure on a fleet with one small pod.

The sessions of workload (b) (``epp_tools.bench.workloads.agentic``: one shared system prompt, a
first user message with the task, then each turn the whole conversation plus the previous answer and
a tool result), with what makes a real agent fleet run short of KV:

* **sub-agents**: each session forks ``subagents`` sub-agents, at seeded turns ``k`` (never the
  first two or the last two); a sub-agent's first turn is the parent's conversation through turn
  ``k`` and its answer, plus a sub-task (``subtask_words``); it then runs ``subagent_turns``
  turns of its own, in parallel with its parent (``BenchRequest.after``: it starts once the
  parent's turn ``k`` is answered; its result does not flow back into the parent);
* **compaction**: a conversation whose next prompt would exceed ``compact_at`` tokens sends a
  compaction turn instead (the conversation, its last answer and a ``compact_words`` instruction,
  asking for ``summary_tokens`` output tokens); from then on its conversation is the system prompt
  and that summary (the answer the simulator generated, as a user message), and it grows again
  from there. The old context becomes dead KV that only eviction reclaims;
* **one-shot requests** between the sessions: ``oneshots`` single requests (a system prompt of
  their own, shared by them, and a fresh question), open loop, spread evenly over the estimated
  length of a session (from the simulator's step model; the sessions are closed loop);
* **the fleet**: 4 pods whose KV adds up to ``kv_factor`` (1.6) x the hot set, pod-0 with
  ``small_pod_factor`` (0.4) x the KV of each of the others (``FleetSpec.pod_gpu_blocks``). The
  hot set is the KV the live conversations hold at the busiest step, the sessions taken in
  lockstep (turn ``t`` of every session at step ``t``, as closed-loop sessions roughly run):
  the current context (input + output) of every session, plus what each running sub-agent adds
  to the context it forked from, plus the two system prompts once; a compacted context and a
  finished sub-agent are dead, not hot. A router that spreads every session over every pod
  evicts on every pod; one that keeps conversations together on pods in proportion to their KV
  fits; the small pod holds about 19% of the fleet's KV, so a router that gives it a quarter of
  the sessions evicts there. The small pod still fits the largest single request (checked).

The oracle's achievable reuse (``epp_tools.bench.workloads.oracle``) ignores capacity, as for every
workload: here it is an upper bound, and "% of oracle" says how much of it a router's placement
keeps despite the evictions (round robin about two thirds, a capacity-aware cache router 90-98%).

Send order (also the oracle's order): by step, where a session's turn ``t`` is step ``t``, a
sub-agent forked at its parent's turn ``k`` runs steps ``k + 1 ...``, and one-shot ``i`` sits at
step ``i * turns / oneshots``; ``BenchRequest.turn`` is that step.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from epp_tools.bench.workloads.agentic import simulated_reply
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec, Message, Workload
from epp_tools.bench.workloads.text import GENERATION_PROMPT_TOKENS, message_tokens, words


@dataclass(frozen=True)
class PressureShape:
    sessions: int
    turns: int
    system_tokens: int
    context_median: int
    context_max: int
    tool_median: int
    tool_max: int
    output_median: int
    output_max: int
    compact_at: int
    compact_words: int
    summary_tokens: int
    subagents: int
    subagent_turns: int
    subtask_words: int
    oneshots: int
    oneshot_system_tokens: int
    oneshot_question_tokens: int
    oneshot_output_tokens: int
    max_model_len: int
    context_sigma: float = 0.2
    tool_sigma: float = 1.0
    output_sigma: float = 0.6
    kv_factor: float = 1.6
    small_pod_factor: float = 0.4


PRESSURE_SHAPES: dict[str, PressureShape] = {
    "default": PressureShape(
        sessions=10, turns=20, system_tokens=2_250, context_median=7_000, context_max=9_000,
        tool_median=200, tool_max=3_000, output_median=80, output_max=512, compact_at=12_000,
        compact_words=40, summary_tokens=300, subagents=2, subagent_turns=4, subtask_words=300,
        oneshots=24, oneshot_system_tokens=600, oneshot_question_tokens=300,
        oneshot_output_tokens=32, max_model_len=131_072,
    ),
    "full": PressureShape(
        sessions=10, turns=32, system_tokens=18_000, context_median=56_000, context_max=72_000,
        tool_median=1_600, tool_max=24_000, output_median=322, output_max=2_048,
        compact_at=96_000, compact_words=200, summary_tokens=2_000, subagents=2,
        subagent_turns=5, subtask_words=2_400, oneshots=48, oneshot_system_tokens=4_800,
        oneshot_question_tokens=2_400, oneshot_output_tokens=128, max_model_len=524_288,
    ),
}  # fmt: skip


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


@dataclass
class _Conv:
    """A conversation being generated: its messages and their token counts in the template."""

    name: str
    messages: list[Message] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, role: str, content: str, n_words: int) -> None:
        self.messages.append({"role": role, "content": content})
        self.tokens.append(message_tokens(role, n_words))

    def prompt_len(self) -> int:
        return sum(self.tokens) + GENERATION_PROMPT_TOKENS

    def fork(self, name: str) -> _Conv:
        return _Conv(name, list(self.messages), list(self.tokens))


_SPEED = FleetSpec()  # the step model the one-shots' spread is estimated with


@dataclass
class _Builder:
    shape: PressureShape
    rng: random.Random
    text: random.Random
    system: Message
    rows: list[tuple[int, int, BenchRequest]] = field(default_factory=list)
    live: dict[int, int] = field(default_factory=dict)
    """Step -> KV tokens the conversations hold then, beyond what they share (module doc)."""
    compactions: int = 0
    conversations: int = 0
    costs: list[float] = field(default_factory=list)
    """Estimated simulated seconds of each session (new tokens / prefill + decode steps)."""

    def _output(self) -> int:
        s = self.shape
        return _lognormal(self.rng, s.output_median, s.output_sigma, 8, s.output_max)

    def _next_user(self, conv: _Conv) -> tuple[int, bool]:
        """Append the turn's new user message; (output tokens, whether the turn compacts)."""
        s = self.shape
        tool = _lognormal(self.rng, s.tool_median, s.tool_sigma, 1, s.tool_max)
        out = self._output()
        if conv.prompt_len() + message_tokens("user", tool) > s.compact_at:
            conv.add("user", words(self.text, s.compact_words), s.compact_words)
            return s.summary_tokens, True
        conv.add("user", words(self.text, tool), tool)
        return out, False

    def run(
        self,
        conv: _Conv,
        turns: int,
        forks: Sequence[int] = (),
        after: tuple[str, int] | None = None,
        base: int = 0,
    ) -> float:
        """Generate ``turns`` turns of ``conv`` (a sub-agent starts after ``after``); count what
        it holds beyond ``base`` shared tokens at each step; its estimated simulated seconds."""
        step0 = after[1] + 1 if after else 0
        order, self.conversations = self.conversations, self.conversations + 1
        step_s = (_SPEED.decode_base_ms + _SPEED.decode_per_seq_ms * self.shape.sessions) / 1e3
        seconds = 0.0
        for j in range(turns):
            out, compacting = self._next_user(conv) if j else (self._output(), False)
            head = after if j == 0 else None
            req = BenchRequest(conv.name, step0 + j, MODEL, tuple(conv.messages), out, after=head)
            self.rows.append((step0 + j, order, req))
            prompt = conv.prompt_len()
            self.live[step0 + j] = self.live.get(step0 + j, 0) + prompt + out - base
            seconds += conv.tokens[-1] / _SPEED.prefill_tokens_per_s + out * step_s
            reply = simulated_reply(conv.messages, prompt, out)
            if compacting:
                self.compactions += 1
                conv.messages, conv.tokens = conv.messages[:1], conv.tokens[:1]
                conv.add("user", reply, out)
            else:
                conv.add("assistant", reply, out)
            if j in forks:
                self._fork(conv, step0 + j, list(forks).index(j))
        return seconds

    def _fork(self, parent: _Conv, step: int, i: int) -> None:
        s = self.shape
        sub = parent.fork(f"{parent.name}.sub-{i}")
        sub.add("user", words(self.text, s.subtask_words), s.subtask_words)
        self.run(sub, s.subagent_turns, after=(parent.name, step), base=sum(parent.tokens))


def _sessions(b: _Builder) -> None:
    s = b.shape
    for n in range(s.sessions):
        context = _lognormal(b.rng, s.context_median, s.context_sigma, 1, s.context_max)
        conv = _Conv(f"agent-{n}")
        conv.add("system", b.system["content"], s.system_tokens)
        conv.add("user", words(b.text, context), context)
        forks = sorted(b.rng.sample(range(2, s.turns - 2), s.subagents))
        b.costs.append(b.run(conv, s.turns, forks, base=conv.tokens[0]))


def _oneshots(b: _Builder, duration: float) -> None:
    s = b.shape
    system = {"role": "system", "content": words(b.text, s.oneshot_system_tokens)}
    for i in range(s.oneshots):
        n = _lognormal(b.rng, s.oneshot_question_tokens, 0.4, 4, 4 * s.oneshot_question_tokens)
        messages = (system, {"role": "user", "content": words(b.text, n)})
        step = round((i + 0.5) * s.turns / s.oneshots)
        at = (i + 0.5) * duration / s.oneshots
        req = BenchRequest(f"oneshot-{i}", step, MODEL, messages, s.oneshot_output_tokens, at=at)
        b.rows.append((step, b.conversations + i, req))


def fleet_for(shape: PressureShape, hot: int, block_size: int = 16, pods: int = 4) -> FleetSpec:
    """KV = ``kv_factor`` x ``hot``, pod-0 with ``small_pod_factor`` x each other pod's KV."""
    share = shape.kv_factor * hot / (pods - 1 + shape.small_pod_factor)
    big = math.ceil(share / block_size)
    small = max(1, round(shape.small_pod_factor * big))
    blocks = (small,) + (big,) * (pods - 1)
    return FleetSpec(
        pods=pods, num_gpu_blocks=big, block_size=block_size, pod_gpu_blocks=blocks,
        max_model_len=shape.max_model_len,
    )  # fmt: skip


def build_pressure(shape: PressureShape, seed: int, time_scale: float = 10.0) -> Workload:
    text = random.Random(seed * 7_919 + 2)
    system = {"role": "system", "content": words(text, shape.system_tokens)}
    b = _Builder(shape, random.Random(seed * 31 + 5), text, system)
    _sessions(b)
    _oneshots(b, statistics.median(b.costs))
    requests = [r for _, _, r in sorted(b.rows, key=lambda row: (row[0], row[1]))]
    prompts = message_tokens("system", shape.system_tokens)
    hot = max(b.live.values()) + prompts + message_tokens("system", shape.oneshot_system_tokens)
    fleet = replace(fleet_for(shape, hot), time_scale=time_scale)
    _check_fits(requests, fleet)
    subs = shape.sessions * shape.subagents
    return Workload(
        name="b-pressure",
        title="agentic sessions under KV pressure",
        description=(
            f"{shape.sessions} agent sessions x {shape.turns} turns, each forking "
            f"{shape.subagents} sub-agents of {shape.subagent_turns} turns from its context, "
            f"compacting to a {shape.summary_tokens}-token summary past {shape.compact_at:,} "
            f"tokens ({b.compactions} compactions), and {shape.oneshots} one-shot requests "
            f"between them; fleet KV {shape.kv_factor:g}x the hot set of {hot:,} tokens, "
            f"pod-0 at {shape.small_pod_factor:g}x the others' KV"
        ),
        requests=requests,
        fleet=fleet,
        concurrency=2 * shape.sessions + 4,
        shape={
            "sessions": shape.sessions,
            "subagents": subs,
            "oneshots": shape.oneshots,
            "compactions": b.compactions,
            "hot_set_tokens": hot,
            "fleet_kv_tokens": sum(fleet.pod_kv_tokens),
            "median_input_tokens": statistics.median(len_tokens(r) for r in requests),
        },
    )


def len_tokens(req: BenchRequest) -> int:
    """Prompt tokens of a request whose contents are words (every message here is)."""
    n = sum(message_tokens(m["role"], len(m["content"]) // 4) for m in req.messages)
    return n + GENERATION_PROMPT_TOKENS


def _check_fits(requests: list[BenchRequest], fleet: FleetSpec) -> None:
    smallest = min(fleet.pod_kv_tokens)
    worst = max(len_tokens(r) + r.max_tokens for r in requests)
    if worst > smallest or worst > fleet.max_model_len:
        raise ValueError(f"a request needs {worst} KV tokens; the smallest pod has {smallest}")
