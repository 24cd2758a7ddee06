"""The agent workloads: Responses sessions of (b), (b-foreign) and (b-pressure); seeded shapes and
the oracle on Responses turns against an expectation built from the simulator's own rules."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from epp_tools.bench.workloads.agentic import AgenticShape, build_agentic, responses_sessions
from epp_tools.bench.workloads.catalog import FOREIGN_MAX_NUM_SEQS, build
from epp_tools.bench.workloads.oracle import compute_oracle
from epp_tools.bench.workloads.pressure import PRESSURE_SHAPES, build_pressure, len_tokens
from epp_tools.bench.workloads.spec import BenchRequest, FleetSpec
from epp_tools.bench.workloads.text import message_tokens
from epp_tools.sim.openai import parse_chat, parse_responses
from epp_tools.sim.tokenizer import detokenize, output_seed, output_token, render_chat

TINY = AgenticShape(
    sessions=4, turns=5, system_tokens=40, context_median=120, context_sigma=0.2,
    context_max=400, tool_median=20, tool_sigma=0.8, tool_max=200, output_median=9,
    output_sigma=0.3, output_max=40,
)  # fmt: skip


def _answer(prompt: Sequence[int], n: int) -> list[int]:
    """What the simulator's engine generates (epp_tools.sim.engine: seed from the prompt)."""
    seed = output_seed(prompt)
    return [output_token(seed, i) for i in range(n)]


def _server_prompts(requests: Sequence[BenchRequest]) -> list[list[int]]:
    """Each request's prompt as one simulated pod holding every response renders it: Responses
    follow-ups are rebuilt from the stored turn (what epp_tools.sim.inference stores), as the server
    does, from the bodies the driver sends."""
    stored: dict[str, tuple[str, list[dict[str, Any]]]] = {}
    prompts = []
    for n, req in enumerate(requests):
        if req.api == "chat":
            parsed = parse_chat(req.body())
        else:
            previous = stored.get(req.session)
            body = req.body(previous[0] if previous else "")
            parsed = parse_responses(body, previous[1] if previous else None)
        prompt = list(parsed.prompts[0])
        text = detokenize(_answer(prompt, req.max_tokens))
        stored[req.session] = (f"resp_{n}", [*parsed.messages, {"role": "assistant",
                                                              "content": text}])  # fmt: skip
        prompts.append(prompt)
    return prompts


def _expected_reuse(prompts: Sequence[list[int]], outputs: Sequence[int], bs: int) -> list[int]:
    """Longest block-aligned prefix shared with anything an earlier request left behind (its
    prompt and answer minus the last token), at least one prompt token computed: by comparing
    token lists directly, without hashing."""
    left: list[list[int]] = []
    out = []
    for prompt, n in zip(prompts, outputs, strict=True):
        best = 0
        for earlier in left:
            common = next(
                (i for i, (a, b) in enumerate(zip(prompt, earlier, strict=False)) if a != b),
                min(len(prompt), len(earlier)),
            )
            best = max(best, common // bs)
        if best and best * bs >= len(prompt):
            best -= 1
        out.append(best * bs)
        left.append(prompt + _answer(prompt, n)[:-1])
    return out


def test_half_the_agentic_sessions_use_the_responses_api_when_built() -> None:
    workload = build("b", seed=2)
    sessions = workload.sessions()
    apis = {name: {r.api for r in turns} for name, turns in sessions.items()}
    assert all(len(a) == 1 for a in apis.values())  # one API per session
    on_responses = sorted(name for name, a in apis.items() if a == {"responses"})
    assert len(on_responses) == len(sessions) // 2 == workload.shape["responses_sessions"]
    again = build("b", seed=2).requests
    assert [(r.session, r.api) for r in again] == [(r.session, r.api) for r in workload.requests]
    assert responses_sessions(TINY, 5) == responses_sessions(TINY, 5)
    assert {responses_sessions(TINY, s) for s in range(8)} != {responses_sessions(TINY, 0)}


def test_responses_follow_up_carries_only_the_tool_result_when_sent() -> None:
    shape = replace(TINY, responses_share=1.0)
    turns = build_agentic(shape, seed=3, fleet=FleetSpec(), concurrency=4).sessions()["agent-0"]
    first, second = turns[0].body(), turns[1].body("resp_x")
    assert turns[0].path == "/v1/responses"
    assert first["instructions"] == turns[0].messages[0]["content"]
    assert [m["content"] for m in first["input"]] == [turns[0].messages[1]["content"]]
    assert "instructions" not in second and second["previous_response_id"] == "resp_x"
    assert second["input"] == [{"type": "message", "role": "user",
                                "content": turns[1].messages[-1]["content"]}]  # fmt: skip
    assert second["max_output_tokens"] == turns[1].max_tokens and second["stream"] is True
    assert set(turns[1].headers()) == {"content-type"}  # no session header
    # without a previous id (a resend after 404) the whole conversation goes as input
    resend = turns[1].body()
    assert len(resend["input"]) == len(turns[1].messages) - 1


@pytest.mark.parametrize("share", [pytest.param(1.0, id="all-responses"),
                                   pytest.param(0.5, id="mixed")])  # fmt: skip
def test_oracle_on_responses_turns_equals_the_rebuilt_conversation_reuse(share: float) -> None:
    workload = build_agentic(replace(TINY, responses_share=share), 7, FleetSpec(), 4)
    requests = workload.requests
    prompts = _server_prompts(requests)
    # the server rebuilds exactly the conversation the request declares
    assert prompts == [render_chat(r.messages) for r in requests]
    oracle = compute_oracle(requests, 16)
    expected = _expected_reuse(prompts, [r.max_tokens for r in requests], 16)
    assert [p for p, _ in oracle.per_request] == [len(p) for p in prompts]
    assert [r for _, r in oracle.per_request] == expected
    assert sum(expected) > 0


def test_foreign_variant_sends_the_agentic_requests_beside_a_busy_pod_when_built() -> None:
    plain, foreign = build("b", seed=4), build("b-foreign", seed=4)
    assert [(r.session, r.messages, r.api) for r in foreign.requests] == [
        (r.session, r.messages, r.api) for r in plain.requests
    ]
    assert foreign.name == "b-foreign" and plain.foreign is None
    assert foreign.foreign is not None
    assert (foreign.foreign.pod, foreign.foreign.waiting) == (0, 10)
    assert foreign.fleet.max_num_seqs == FOREIGN_MAX_NUM_SEQS
    assert foreign.fleet.pod_kv_tokens == plain.fleet.pod_kv_tokens


def _pressure() -> Any:
    return build("b-pressure", seed=1)


def test_pressure_fleet_is_1_6x_the_hot_set_with_a_small_pod_when_built() -> None:
    w = _pressure()
    kv = w.fleet.pod_kv_tokens
    hot = w.shape["hot_set_tokens"]
    assert kv[0] == pytest.approx(0.4 * kv[1], abs=16) and len(set(kv[1:])) == 1
    assert sum(kv) == pytest.approx(1.6 * hot, rel=0.01)
    assert "--pod-num-gpu-blocks" in w.fleet.sim_args()
    assert all(len_tokens(r) == len(render_chat(r.messages)) for r in w.requests)
    assert max(len_tokens(r) + r.max_tokens for r in w.requests) <= kv[0]


def test_pressure_hot_set_is_the_busiest_step_of_live_contexts_when_counted() -> None:
    w = _pressure()
    shape = PRESSURE_SHAPES["default"]
    system = message_tokens("system", shape.system_tokens)
    live: dict[int, int] = {}
    for session, turns in w.sessions().items():
        if session.startswith("oneshot-"):
            continue
        first = turns[0]
        # shared with others: the system prompt, or for a sub-agent the context it forked from
        forked = len_tokens(first) - 4 - message_tokens("user", shape.subtask_words)
        shared = forked if first.after else system
        for r in turns:
            live[r.turn] = live.get(r.turn, 0) + len_tokens(r) + r.max_tokens - shared
    oneshot_system = message_tokens("system", shape.oneshot_system_tokens)
    assert w.shape["hot_set_tokens"] == max(live.values()) + system + oneshot_system


def test_pressure_full_scale_fits_its_smallest_pod_when_built() -> None:
    w = build_pressure(PRESSURE_SHAPES["full"], 2)
    assert max(len_tokens(r) + r.max_tokens for r in w.requests) <= min(w.fleet.pod_kv_tokens)


def test_sub_agents_fork_from_the_parent_context_after_its_turn_when_built() -> None:
    w = _pressure()
    position = {(r.session, r.turn): i for i, r in enumerate(w.requests)}
    subs = {name: turns for name, turns in w.sessions().items() if ".sub-" in name}
    shape = PRESSURE_SHAPES["default"]
    assert len(subs) == w.shape["subagents"] == shape.sessions * shape.subagents
    for name, turns in subs.items():
        parent_name, k = turns[0].after or ("", -1)
        assert name.startswith(parent_name + ".sub-")
        parent = w.requests[position[(parent_name, k)]]
        assert position[(parent_name, k)] < position[(name, turns[0].turn)]
        reply = detokenize(_answer(render_chat(parent.messages), parent.max_tokens))
        n = len(parent.messages)
        assert turns[0].messages[:n] == parent.messages
        assert turns[0].messages[n] == {"role": "assistant", "content": reply}
        assert len(turns[0].messages) == n + 2 and turns[0].messages[-1]["role"] == "user"
        assert [t.turn for t in turns] == list(range(k + 1, k + 1 + len(turns)))
        assert all(t.after is None for t in turns[1:])


def test_compaction_replaces_the_conversation_with_its_summary_when_it_grows() -> None:
    w = _pressure()
    shape = PRESSURE_SHAPES["default"]
    resets = 0
    for turns in w.sessions().values():
        for prev, nxt in itertools.pairwise(turns):
            if nxt.messages[: len(prev.messages)] == prev.messages:
                continue  # the conversation went on
            resets += 1
            summary = detokenize(_answer(render_chat(prev.messages), prev.max_tokens))
            assert prev.max_tokens == shape.summary_tokens
            assert len(prev.messages[-1]["content"]) // 4 == shape.compact_words
            assert nxt.messages[:2] == (prev.messages[0], {"role": "user", "content": summary})
            assert len(nxt.messages) == 3
    assert 1 <= resets <= w.shape["compactions"]
    assert max(len_tokens(r) for r in w.requests) <= shape.compact_at + shape.output_max + 64


def test_one_shots_arrive_spread_between_the_sessions_when_built() -> None:
    w = _pressure()
    shots = [r for r in w.requests if r.session.startswith("oneshot-")]
    assert len(shots) == w.shape["oneshots"] == 24
    assert len({r.session for r in shots}) == len(shots)
    times = sorted(r.at for r in shots)
    assert times[0] > 0 and len(set(times)) == len(times)
    assert len({r.messages[0]["content"] for r in shots}) == 1
    agent_system = w.requests[0].messages[0]["content"]
    assert shots[0].messages[0]["content"] != agent_system


def test_pressure_oracle_reuses_the_parent_context_on_a_fork_when_computed() -> None:
    w = _pressure()
    oracle = compute_oracle(w.requests, 16)
    rows = dict(zip(((r.session, r.turn) for r in w.requests), oracle.per_request, strict=True))
    position = {(r.session, r.turn): i for i, r in enumerate(w.requests)}
    for sub in (r for r in w.requests if r.after):
        parent = w.requests[position[sub.after]]
        prompt, reused = rows[(sub.session, sub.turn)]
        assert prompt == len_tokens(sub)
        # the parent's prompt and answer (minus its last token), or, if the parent's next turn
        # came first, also its end marker and the next user header: whole blocks of that
        shared = len_tokens(parent) + parent.max_tokens
        assert (shared - 1) // 16 * 16 <= reused <= (shared + 5) // 16 * 16
    assert 0.5 < oracle.ratio < 1.0
