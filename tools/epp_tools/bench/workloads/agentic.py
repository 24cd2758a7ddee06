"""Workload (b): agentic multi-turn sessions with a growing context, shaped like coding agents.

Target shape (llm-d's GLM-5.2 study of Claude-Code traces): median input about 195K tokens,
about 317 output tokens, 96% of turns reusing at least 90% of their input (median reuse 99.6%).

Model of one session (all counts in tokens; one word = one token, see
``epp_tools.bench.workloads.text``):

* turn 0: a system prompt shared by every session (the agent harness and its tool schemas,
  ``system_tokens``) and a first user message with the task and the files read up front
  (lognormal, median ``context_median``, ``context_sigma``, at most ``context_max``);
* turn k > 0: the whole conversation again, plus the assistant's previous answer (exactly what
  the simulator generated, as an agent would send it back) and a tool result (lognormal, median
  ``tool_median``, ``tool_sigma``, at most ``tool_max``);
* each turn asks for ``max_tokens`` drawn lognormal around ``output_median``.

A turn reuses everything the previous turn left in the cache (its prompt and its answer), so
its reuse is ``1 - new tokens / input``: low on the first turn of a session (only the shared
system prompt) and on the rare turn with a huge tool result, about 99% otherwise. Sessions run
concurrently (closed loop, one request in flight per session, no think time).

Responses API sessions: ``responses_share`` of the sessions (half by default, rounded; which
ones is drawn from the seed) talk to ``/v1/responses`` instead of chat completions. Their first
turn opens a chain (the system prompt as ``instructions``, the first user message as input);
every later turn sends ``previous_response_id`` of the previous answer and only the tool result,
without a session header, and the server rebuilds the conversation from what it stored: the
previous turn's conversation plus the answer it generated, then the new input. That is exactly
the conversation a chat session resends, so both kinds of session have the same token plan and
the same achievable reuse (``epp_tools.bench.workloads.oracle`` renders ``BenchRequest.messages``,
which for a Responses turn is that rebuilt conversation). A follow-up only succeeds on the pod
holding the previous response; the driver resends a follow-up answered 404 as a new chain
(``epp_tools.bench.runner.driver``).

Scales (``AGENTIC_SHAPES``):

* ``full``: 8 sessions x 48 turns, median input ~195K tokens (bodies of ~800 KB), median output
  ~317, >= 96% of turns with reuse >= 90%;
* ``default``: the same shape with inputs divided by 8 and outputs by 4 (8 sessions x 28 turns,
  median input ~24K, output ~80), so a run takes seconds; the fleet is scaled the same way.

``plan_sessions`` produces the token counts only (cheap at any size; the shape statistics come
from it), ``build_agentic`` turns a plan into requests with real text.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec, Message, Workload
from epp_tools.bench.workloads.text import message_tokens, prompt_tokens, words
from epp_tools.sim.tokenizer import detokenize, output_seed, output_token, render_chat

_TAIL_TOKENS = 256  # what epp_tools.sim.tokenizer.output_seed reads of a prompt


@dataclass(frozen=True)
class AgenticShape:
    sessions: int
    turns: int
    system_tokens: int
    context_median: int
    context_sigma: float
    context_max: int
    tool_median: int
    tool_sigma: float
    tool_max: int
    output_median: int
    output_sigma: float
    output_max: int
    responses_share: float = 0.5
    """Share of the sessions that use the Responses API (see the module doc)."""


AGENTIC_SHAPES: dict[str, AgenticShape] = {
    "full": AgenticShape(
        sessions=8,
        turns=48,
        system_tokens=18_000,
        context_median=125_000,
        context_sigma=0.2,
        context_max=260_000,
        tool_median=1_000,
        tool_sigma=1.1,
        tool_max=40_000,
        output_median=322,
        output_sigma=0.6,
        output_max=2_048,
    ),
    "default": AgenticShape(
        sessions=8,
        turns=28,
        system_tokens=2_250,
        context_median=17_500,
        context_sigma=0.2,
        context_max=32_500,
        tool_median=125,
        tool_sigma=1.1,
        tool_max=5_000,
        output_median=80,
        output_sigma=0.6,
        output_max=512,
    ),
}


@dataclass(frozen=True)
class TurnPlan:
    new_words: int
    """Words of the turn's new user message (the first context, or a tool result)."""
    max_tokens: int
    input_tokens: int
    reused_tokens: int
    """Tokens of the prompt that the previous turn left in the cache (turn 0: system prompt)."""


def _lognormal(rng: random.Random, median: int, sigma: float, lo: int, hi: int) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(math.log(median), sigma))))


def plan_sessions(shape: AgenticShape, seed: int) -> list[list[TurnPlan]]:
    rng = random.Random(seed)
    system_msg = message_tokens("system", shape.system_tokens)
    sessions: list[list[TurnPlan]] = []
    for _ in range(shape.sessions):
        turns: list[TurnPlan] = []
        context = _lognormal(rng, shape.context_median, shape.context_sigma, 1, shape.context_max)
        prev_input = prev_out = 0
        for t in range(shape.turns):
            tool = _lognormal(rng, shape.tool_median, shape.tool_sigma, 1, shape.tool_max)
            new = context if t == 0 else tool
            out = _lognormal(rng, shape.output_median, shape.output_sigma, 8, shape.output_max)
            if t == 0:
                input_tokens = prompt_tokens([("system", shape.system_tokens), ("user", new)])
                reused = system_msg
            else:
                # previous prompt (ends with the assistant header) + answer + "<|end|>" + new msg
                input_tokens = prev_input + prev_out + 2 + message_tokens("user", new) + 4
                reused = prev_input + prev_out - 1
            turns.append(TurnPlan(new, out, input_tokens, reused))
            prev_input, prev_out = input_tokens, out
        sessions.append(turns)
    return sessions


def responses_sessions(shape: AgenticShape, seed: int) -> frozenset[int]:
    """Indexes of the sessions that use the Responses API (seeded, ``responses_share``)."""
    count = round(shape.responses_share * shape.sessions)
    chosen = random.Random(seed * 104_729 + 17).sample(range(shape.sessions), count)
    return frozenset(chosen)


def shape_stats(plan: list[list[TurnPlan]]) -> dict[str, float]:
    turns = [t for session in plan for t in session]
    reuse = [t.reused_tokens / t.input_tokens for t in turns]
    return {
        "sessions": len(plan),
        "turns": len(turns),
        "median_input_tokens": statistics.median(t.input_tokens for t in turns),
        "max_input_tokens": max(t.input_tokens for t in turns),
        "median_output_tokens": statistics.median(t.max_tokens for t in turns),
        "share_turns_reuse_ge_90": sum(r >= 0.9 for r in reuse) / len(reuse),
        "median_reuse": statistics.median(reuse),
    }


def simulated_reply(messages: list[Message], prompt_len: int, max_tokens: int) -> str:
    """The simulator's answer to ``messages``, from the prompt's tail only.

    The rendered conversation is the concatenation of its messages' tokens, so the last tokens
    come from the last messages alone; ``prompt_len`` is the whole prompt's length.
    """
    tail: list[int] = []
    for k in range(1, len(messages) + 1):
        tail = render_chat(messages[-k:])
        if len(tail) >= _TAIL_TOKENS or k == len(messages):
            break
    seed = output_seed(tail[-_TAIL_TOKENS:]) - len(tail[-_TAIL_TOKENS:]) + prompt_len
    return detokenize([output_token(seed, i) for i in range(max_tokens)])


def build_agentic(shape: AgenticShape, seed: int, fleet: FleetSpec, concurrency: int) -> Workload:
    plan = plan_sessions(shape, seed)
    via_responses = responses_sessions(shape, seed)
    text_rng = random.Random(seed * 7919 + 1)
    system = {"role": "system", "content": words(text_rng, shape.system_tokens)}
    ordered: list[tuple[int, int, BenchRequest]] = []
    for s, turns in enumerate(plan):
        messages: list[Message] = [system]
        for t, turn in enumerate(turns):
            if t > 0:
                prev = turns[t - 1]
                reply = simulated_reply(messages, prev.input_tokens, prev.max_tokens)
                messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": words(text_rng, turn.new_words)})
            request = BenchRequest(
                session=f"agent-{s}",
                turn=t,
                model=MODEL,
                messages=tuple(messages),
                max_tokens=turn.max_tokens,
                api="responses" if s in via_responses else "chat",
            )
            ordered.append((t, s, request))
    # send order: turn-major, as concurrent sessions issue them
    requests = [r for _, _, r in sorted(ordered, key=lambda x: (x[0], x[1]))]
    return Workload(
        name="b",
        title="agentic multi-turn sessions",
        description=(
            f"{shape.sessions} concurrent agent sessions x {shape.turns} turns; the whole "
            "growing conversation is resent each turn with the previous answer and a tool "
            f"result, except in {len(via_responses)} sessions on the Responses API, whose "
            "follow-ups send previous_response_id and the tool result only; one system prompt "
            "shared by all sessions"
        ),
        requests=requests,
        fleet=fleet,
        concurrency=concurrency,
        shape={**shape_stats(plan), "responses_sessions": len(via_responses)},
    )
