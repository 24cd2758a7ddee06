from __future__ import annotations

import itertools
import statistics

import pytest

from epp_tools.bench.workloads.agentic import (
    AGENTIC_SHAPES,
    AgenticShape,
    build_agentic,
    plan_sessions,
)
from epp_tools.bench.workloads.catalog import build, resolve
from epp_tools.bench.workloads.oracle import generated_ids
from epp_tools.bench.workloads.spec import BenchRequest, FleetSpec, limit_requests
from epp_tools.bench.workloads.text import message_tokens, percentile, prompt_tokens, words
from epp_tools.sim.tokenizer import detokenize, render_chat

TINY = AgenticShape(
    sessions=3,
    turns=5,
    system_tokens=40,
    context_median=120,
    context_sigma=0.2,
    context_max=400,
    tool_median=20,
    tool_sigma=0.8,
    tool_max=200,
    output_median=9,
    output_sigma=0.3,
    output_max=40,
)


def _fingerprint(requests: list[BenchRequest]) -> list[tuple[object, ...]]:
    return [
        (
            r.session,
            r.turn,
            r.model,
            r.messages,
            r.max_tokens,
            r.at,
            r.objective,
            r.fairness_id,
            r.api,
            r.after,
        )
        for r in requests
    ]


@pytest.mark.parametrize(
    "name", [pytest.param(n, id=n) for n in ("a", "b", "b-foreign", "b-pressure", "c", "d")]
)
def test_workload_is_identical_when_built_twice_with_one_seed(name: str) -> None:
    first = build(name, seed=3)
    again = build(name, seed=3)
    other = build(name, seed=4)
    assert _fingerprint(first.requests) == _fingerprint(again.requests)
    assert _fingerprint(first.requests) != _fingerprint(other.requests)
    assert first.fleet == again.fleet


@pytest.mark.parametrize(
    ("role", "n"),
    [
        pytest.param("system", 0, id="system-empty"),
        pytest.param("user", 7, id="user"),
        pytest.param("assistant", 31, id="assistant"),
        pytest.param("tool", 3, id="tool"),
    ],
)
def test_message_tokens_match_the_simulator_template_when_content_is_words(
    role: str, n: int
) -> None:
    import random

    text = words(random.Random(n), n)
    rendered = render_chat([{"role": role, "content": text}], add_generation_prompt=False)
    assert len(rendered) == message_tokens(role, n)
    assert len(render_chat([{"role": role, "content": text}])) == prompt_tokens([(role, n)])


def test_agentic_plan_counts_equal_the_rendered_prompts_when_materialized() -> None:
    workload = build_agentic(TINY, seed=5, fleet=FleetSpec(), concurrency=TINY.sessions)
    plan = plan_sessions(TINY, seed=5)
    by_session = workload.sessions()
    for s, turns in enumerate(plan):
        requests = by_session[f"agent-{s}"]
        assert [len(render_chat(r.messages)) for r in requests] == [t.input_tokens for t in turns]
        assert [r.max_tokens for r in requests] == [t.max_tokens for t in turns]


def test_agentic_turn_resends_the_simulated_answer_when_the_session_goes_on() -> None:
    workload = build_agentic(TINY, seed=2, fleet=FleetSpec(), concurrency=TINY.sessions)
    for turns in workload.sessions().values():
        for prev, nxt in itertools.pairwise(turns):
            answer = nxt.messages[len(prev.messages)]
            expected = detokenize(generated_ids(render_chat(prev.messages), prev.max_tokens))
            assert answer == {"role": "assistant", "content": expected}
            assert nxt.messages[: len(prev.messages)] == prev.messages


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"seed-{s}") for s in (1, 2, 3)])
def test_agentic_full_shape_matches_the_coding_agent_traces_when_planned(seed: int) -> None:
    plan = plan_sessions(AGENTIC_SHAPES["full"], seed)
    turns = [t for session in plan for t in session]
    median_input = statistics.median(t.input_tokens for t in turns)
    median_output = statistics.median(t.max_tokens for t in turns)
    high_reuse = sum(t.reused_tokens / t.input_tokens >= 0.9 for t in turns) / len(turns)
    assert 170_000 <= median_input <= 220_000
    assert 285 <= median_output <= 350
    assert high_reuse >= 0.96


def test_agentic_default_scale_reports_its_shape_when_built() -> None:
    workload = build("agentic")
    shape = workload.shape
    assert shape["turns"] == len(workload.requests) == 8 * 28
    rendered = statistics.median(len(render_chat(list(r.messages))) for r in workload.requests)
    assert shape["median_input_tokens"] == pytest.approx(rendered, rel=0.01)
    assert 20_000 <= rendered <= 30_000
    assert shape["share_turns_reuse_ge_90"] >= 0.9
    assert workload.concurrency == 8


def test_multi_lora_requests_name_adapters_the_fleet_serves_when_built() -> None:
    workload = build("c")
    adapters = set(workload.fleet.lora_adapters)
    assert {r.model for r in workload.requests} <= adapters
    assert len(adapters) == 8
    assert workload.epp_extra_scorers == (("lora-affinity-scorer", 2),)
    assert "--lora" in workload.fleet.sim_args()


def test_time_scale_overrides_the_fleet_when_given() -> None:
    assert build("a", time_scale=3.5).fleet.time_scale == 3.5
    assert build("a").fleet.time_scale == 10.0


@pytest.mark.parametrize(
    ("name", "key"),
    [
        pytest.param("a", "a", id="key"),
        pytest.param("Agentic", "b", id="long-name"),
        pytest.param(" multi-lora ", "c", id="spaces"),
    ],
)
def test_resolve_accepts_keys_and_long_names_when_given(name: str, key: str) -> None:
    assert resolve(name) == key


def test_resolve_lists_the_known_workloads_when_the_name_is_unknown() -> None:
    with pytest.raises(ValueError, match="shared-prefix"):
        resolve("z")


def test_limit_requests_keeps_every_predecessor_turn_when_truncating() -> None:
    requests = build_agentic(TINY, seed=1, fleet=FleetSpec(), concurrency=3).requests
    kept = limit_requests(requests, 7)
    assert len(kept) == 7
    turns: dict[str, list[int]] = {}
    for r in kept:
        turns.setdefault(r.session, []).append(r.turn)
    assert all(t == list(range(len(t))) for t in turns.values())
    assert len(turns) == TINY.sessions  # every session keeps its first turn
    assert limit_requests(requests, 0) == requests


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([], 0.5, 0.0, id="empty"),
        pytest.param([3.0], 0.99, 3.0, id="single"),
        pytest.param([4.0, 1.0, 3.0, 2.0], 0.5, 2.0, id="median-nearest-rank"),
        pytest.param(list(range(1, 101)), 0.9, 90.0, id="p90"),
        pytest.param(list(range(1, 101)), 0.99, 99.0, id="p99"),
    ],
)
def test_percentile_is_nearest_rank_when_given_values(
    values: list[float], q: float, expected: float
) -> None:
    assert percentile(values, q) == expected
