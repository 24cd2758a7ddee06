"""The workloads of ``epp stack``: the agentic one resends each agent's growing context (a
harness prompt every agent shares, a task context of its own), one wave per turn; the table
shows TTFT to the first SSE line, or to the first content token for the agentic run."""

from __future__ import annotations

import itertools

from epp_tools.stack.workload import Summary, agentic_workload, mixed_workload, table


def test_every_agent_resends_its_growing_context_each_turn_when_built() -> None:
    waves = agentic_workload(seed=3, agents=5, turns=4)
    assert [len(w) for w in waves] == [5] * 4
    harness = waves[0][0].messages[0]["content"]
    by_agent: dict[str, list[tuple[dict[str, str], ...]]] = {}
    for wave in waves:
        for item in wave:
            by_agent.setdefault(item.session, []).append(item.messages)
    assert len(by_agent) == 5
    contexts = set()
    for turns in by_agent.values():
        assert len(turns) == 4
        for earlier, later in itertools.pairwise(turns):
            assert later[: len(earlier)] == earlier  # the previous turn is a prefix
            assert len(later) == len(earlier) + 2  # its answer and a tool result
        assert turns[0][0] == {"role": "system", "content": harness}
        contexts.add(turns[0][1]["content"])
    assert len(contexts) == 5  # a task context of its own
    assert agentic_workload(seed=3, agents=5, turns=4) == waves
    assert agentic_workload(seed=4, agents=5, turns=4) != waves


def test_the_agentic_contexts_are_long_against_the_mixed_workloads_when_built() -> None:
    """What makes prefix affinity pay in TTFT: the context a turn resends dwarfs what it adds."""
    waves = agentic_workload()
    first = sum(len(m["content"]) for m in waves[0][0].messages)
    last = sum(len(m["content"]) for m in waves[-1][0].messages)
    mixed = max(sum(len(m["content"]) for m in i.messages) for w in mixed_workload() for i in w)
    assert first > 2 * mixed
    added = (last - first) / (len(waves) - 1)
    assert added < first / 10


def test_table_shows_ttft_to_the_first_line_or_to_the_first_token_when_asked() -> None:
    row = Summary(
        "EPP", requests=4, errors=0, hit_ratio=0.5, ttft_p50_ms=1.0, ttft_p90_ms=2.0,
        per_pod={"pod-0": 4}, first_token_p50_ms=30.0, first_token_p90_ms=40.0,
    )  # fmt: skip
    assert table([row]).splitlines()[2].split()[4:6] == ["1.0ms", "2.0ms"]
    assert table([row], first_token=True).splitlines()[2].split()[4:6] == ["30.0ms", "40.0ms"]
