"""The agents of ``epp bench scale``: their shape against llm-d's study, and their oracle."""

from __future__ import annotations

import statistics

from epp_tools.bench.scale.agents import Agent, Turn, harness_prompt, reusable
from epp_tools.bench.scale.shape import (
    BLOCK_SIZE,
    AgentShape,
    Scaling,
    fleet_for,
    working_set_tokens,
)
from epp_tools.bench.workloads.oracle import compute_oracle


def _run_offline(shape: AgentShape, scaling: Scaling, agents: int, turns: int) -> list[Turn]:
    """Every agent's turns answered in order, each sub-agent's turns right after its fork."""
    system = harness_prompt(shape, scaling, 1)
    out: list[Turn] = []
    for i in range(agents):
        agent = Agent.main(f"a{i}", shape, scaling, 100 + i, system)
        for t in range(turns):
            out.append(agent.next_turn())
            agent.answered(True, "")
            sub = agent.fork(t)
            while sub is not None and not sub.done:
                out.append(sub.next_turn())
                sub.answered(True, "")
    return out


def test_the_analytic_oracle_equals_the_benchmarks_oracle_request_by_request() -> None:
    shape = AgentShape(subagent_chance=0.3, compact_at=190_000)  # forks and compactions happen
    scaling = Scaling(length_factor=64)
    turns = _run_offline(shape, scaling, agents=4, turns=8)
    assert any(t.compacting for t in turns) and any(t.request.session.count(".sub-") for t in turns)
    oracle = compute_oracle([t.request for t in turns], BLOCK_SIZE)
    # the very first request has nothing before it; every agent after shares the harness prompt
    expected = [0] + [t.reusable_tokens for t in turns[1:]]
    assert [r for _, r in oracle.per_request] == expected
    assert [p for p, _ in oracle.per_request] == [t.prompt_tokens for t in turns]


def test_the_agents_keep_the_studys_ratios_at_the_default_scale() -> None:
    turns = [t for t in _run_offline(AgentShape(), Scaling(), agents=120, turns=15) if t.added]
    prompt = statistics.median(t.prompt_tokens for t in turns)
    output = statistics.median(t.request.max_tokens for t in turns)
    reuse = [t.reusable_tokens / t.prompt_tokens for t in turns]
    assert 5_600 <= prompt <= 6_600  # 195,000 real tokens / 32
    assert output == 10  # 317 / 32
    assert 550 <= prompt / output <= 680  # 195,000 : 317
    assert sum(r >= 0.9 for r in reuse) / len(reuse) >= 0.96


def test_a_failed_turn_is_dropped_and_the_first_context_kept() -> None:
    shape, scaling = AgentShape(), Scaling()
    agent = Agent.main("a", shape, scaling, 7, harness_prompt(shape, scaling, 1))
    first = agent.next_turn()
    agent.answered(False)
    again = agent.next_turn()
    assert again.prompt_tokens > first.prompt_tokens  # the context stays, a tool result follows
    assert again.request.messages[: len(first.request.messages)] == first.request.messages
    agent.answered(True, "resp-1")
    follow = agent.next_turn()
    assert follow.reusable_tokens == reusable(again.prompt_tokens + again.request.max_tokens - 1,
                                              follow.prompt_tokens)  # fmt: skip
    assert agent.response_id == "resp-1"


def test_the_fleet_holds_the_asked_multiple_of_the_working_set() -> None:
    shape, scaling = AgentShape(), Scaling()
    fleet = fleet_for(shape, scaling, agents=3000, pods=16, kv_factor=1.2)
    kv = sum(fleet.pod_kv_tokens)
    ws = working_set_tokens(shape, scaling, 3000)
    assert 1.2 <= kv / ws < 1.2 + 16 * BLOCK_SIZE / ws
    assert fleet.decode_base_ms == 12.0 * 32 and fleet.prefill_tokens_per_s == 200_000 / 32


def test_a_compaction_turn_writes_an_answer_within_the_output_cap() -> None:
    # A summary longer than the shape's longest answer would last minutes of decode more than
    # any other turn (and was cut by the client's timeout): the compaction output is capped.
    shape = AgentShape(compact_at=190_000, summary_tokens=30_000)
    scaling = Scaling(length_factor=64)
    turns = _run_offline(shape, scaling, agents=4, turns=8)
    compactions = [t for t in turns if t.compacting]
    assert compactions
    assert all(t.request.max_tokens == scaling.tokens(shape.output_max) for t in compactions)
