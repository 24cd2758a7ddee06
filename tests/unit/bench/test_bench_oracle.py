from __future__ import annotations

import random

import pytest

from epp_tools.bench.workloads.agentic import AgenticShape, build_agentic
from epp_tools.bench.workloads.oracle import compute_oracle
from epp_tools.bench.workloads.spec import MODEL, BenchRequest, FleetSpec
from epp_tools.bench.workloads.text import words
from epp_tools.sim.config import PodConfig
from epp_tools.sim.engine import Engine
from epp_tools.sim.tokenizer import render_chat

BS = 16


def _req(system: str, question: str, *, model: str = MODEL, max_tokens: int = 4) -> BenchRequest:
    messages = ({"role": "system", "content": system}, {"role": "user", "content": question})
    return BenchRequest("s", 0, model, messages, max_tokens)


def _engine_cached(requests: list[BenchRequest], loras: tuple[str, ...] = ()) -> list[int]:
    """Cached tokens the simulator's engine reports when the requests run one after another
    on one pod with room for everything."""
    engine = Engine(PodConfig(num_gpu_blocks=200_000, max_model_len=1_000_000, lora_adapters=loras))
    cached: list[int] = []
    now = 0.0
    for i, r in enumerate(requests):
        lora = r.model if r.model != MODEL else None
        engine.add_request(f"r{i}", render_chat(r.messages), r.max_tokens, now, lora)
        events = engine.advance(now)  # starts the first step at ``now``
        events += engine.advance(now + 1_000.0)
        events = [e for e in events if e.finished]
        assert len(events) == 1
        cached.append(events[0].cached_tokens)
        now += 1_000.0
    return cached


def test_oracle_finds_no_reuse_when_prompts_share_nothing() -> None:
    rng = random.Random(1)
    requests = [_req(words(rng, 100), words(rng, 10)) for _ in range(3)]
    oracle = compute_oracle(requests, BS)
    assert oracle.reusable_tokens == 0
    assert oracle.ratio == 0.0
    assert oracle.prompt_tokens == sum(len(render_chat(r.messages)) for r in requests)


def test_oracle_reuses_whole_blocks_of_the_shared_system_prompt_when_groups_repeat() -> None:
    rng = random.Random(2)
    system = words(rng, 200)
    requests = [_req(system, words(rng, 30)) for _ in range(3)]
    oracle = compute_oracle(requests, BS)
    shared = 3 + 200 + 2 + 3  # system header, words, "<|end|>", user header
    per = [r for _, r in oracle.per_request]
    assert per == [0, shared // BS * BS, shared // BS * BS]


def test_oracle_keeps_one_block_to_compute_when_a_prompt_repeats_exactly() -> None:
    rng = random.Random(3)
    request = _req(words(rng, 125), words(rng, 10))
    oracle = compute_oracle([request, request], BS)
    n = len(render_chat(request.messages))
    assert oracle.per_request[1] == (n, n // BS * BS if n % BS else n - BS)


def test_oracle_never_reuses_across_models_when_an_adapter_differs() -> None:
    rng = random.Random(4)
    system = words(rng, 300)
    requests = [_req(system, "a b "), _req(system, "c d ", model="lora-1")]
    assert compute_oracle(requests, BS).per_request[1][1] == 0


@pytest.mark.parametrize(
    "case",
    [pytest.param("groups", id="shared-system-prompts"), pytest.param("lora", id="lora")],
)
def test_oracle_equals_the_engine_cache_when_requests_run_in_order(case: str) -> None:
    rng = random.Random(5)
    systems = [words(rng, 150), words(rng, 90)]
    models = [MODEL, "lora-a"] if case == "lora" else [MODEL]
    requests = [
        _req(rng.choice(systems), words(rng, rng.randrange(1, 40)), model=rng.choice(models))
        for _ in range(12)
    ]
    oracle = compute_oracle(requests, BS)
    loras = ("lora-a",) if case == "lora" else ()
    assert [r for _, r in oracle.per_request] == _engine_cached(requests, loras)


def test_oracle_counts_the_previous_answer_when_an_agent_session_goes_on() -> None:
    shape = AgenticShape(
        sessions=2, turns=4, system_tokens=50, context_median=200, context_sigma=0.1,
        context_max=400, tool_median=30, tool_sigma=0.5, tool_max=100, output_median=40,
        output_sigma=0.2, output_max=80,
    )  # fmt: skip
    workload = build_agentic(shape, seed=9, fleet=FleetSpec(), concurrency=2)
    oracle = compute_oracle(workload.requests, BS)
    assert [r for _, r in oracle.per_request] == _engine_cached(workload.requests)
    later = [
        r for (p, r), req in zip(oracle.per_request, workload.requests, strict=True) if req.turn
    ]
    assert all(r > 0 for r in later)
    assert 0.5 < oracle.ratio < 1.0
    assert oracle.as_json()["achievable_reuse"] == round(oracle.ratio, 6)
