from __future__ import annotations

from typing import Any

import pytest

from epp_tools.sim.config import PodConfig
from epp_tools.sim.engine import Engine, RequestRejected, TokenEvent
from epp_tools.sim.kvcache import AllBlocksCleared, BlockRemoved, BlockStored

BASE: dict[str, Any] = {
    "block_size": 4,
    "num_gpu_blocks": 64,
    "decode_base_ms": 10.0,
    "decode_per_seq_ms": 1.0,
    "prefill_tokens_per_s": 1000.0,
}


def make_engine(**changes: Any) -> Engine:
    return Engine(PodConfig(**{**BASE, **changes}))


def prompt(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def run(engine: Engine, now: float = 0.0, max_steps: int = 100_000) -> list[TokenEvent]:
    """Advance from ``now`` through every step until the engine is idle."""
    out = engine.advance(now)
    for _ in range(max_steps):
        wake = engine.next_wakeup()
        if wake is None:
            return out
        out += engine.advance(wake)
    raise AssertionError("engine did not become idle")


def finished(events: list[TokenEvent]) -> dict[str, TokenEvent]:
    return {e.request_id: e for e in events if e.finished}


def test_second_identical_prompt_hits_prefix_cache_when_first_finished() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(10), 2, 0.0)
    first = finished(run(engine))["a"]
    engine.add_request("b", prompt(10), 2, 1.0)
    second = finished(run(engine, 1.0))["b"]
    assert first.cached_tokens == 0
    assert second.cached_tokens == 8  # two full blocks of 4; the partial block is recomputed
    assert engine.stats.prefix_queries == 20
    assert engine.stats.prefix_hits == 8


@pytest.mark.parametrize(
    ("first", "second", "lora", "expected"),
    [
        pytest.param(prompt(8), prompt(8), None, 4, id="full-match-recomputes-last-block"),
        pytest.param(prompt(12), [*prompt(8), 99, 98, 97, 96], None, 8, id="shared-prefix"),
        pytest.param(prompt(12), [0, *prompt(11)], None, 0, id="different-first-block"),
        pytest.param(prompt(12), prompt(12), "a", 0, id="other-lora-does-not-share"),
    ],
)
def test_prefix_hits_count_tokens_of_cached_leading_blocks_when_prompts_overlap(
    first: list[int], second: list[int], lora: str | None, expected: int
) -> None:
    engine = make_engine(lora_adapters=("a",))
    engine.add_request("a", first, 1, 0.0)
    run(engine)
    engine.add_request("b", second, 1, 1.0, lora=lora)
    assert finished(run(engine, 1.0))["b"].cached_tokens == expected


def test_eviction_takes_least_recently_released_blocks_when_pool_is_full() -> None:
    engine = make_engine(num_gpu_blocks=8)
    engine.add_request("a", prompt(16, 100), 1, 0.0)  # 4 blocks, cached after finishing
    run(engine)
    (a_stored,) = engine.drain_kv_events()
    engine.add_request("b", prompt(16, 200), 1, 1.0)  # 4 more blocks: pool now full of cache
    run(engine, 1.0)
    assert (engine.pool.used_blocks, engine.pool.cached_blocks) == (0, 8)
    engine.drain_kv_events()
    engine.add_request("c", prompt(8, 300), 1, 2.0)  # needs 2 blocks
    run(engine, 2.0)
    removed = [e for e in engine.drain_kv_events() if isinstance(e, BlockRemoved)]
    assert isinstance(a_stored, BlockStored)
    a3, a2 = a_stored.block_hashes[3], a_stored.block_hashes[2]
    assert [h for e in removed for h in e.block_hashes] == [a3, a2]  # a released first, tail first
    assert engine.pool.evictions == 2
    engine.add_request("a2", prompt(16, 100), 1, 3.0)
    assert finished(run(engine, 3.0))["a2"].cached_tokens == 8  # head of a's chain survived


def test_requests_wait_in_fifo_order_when_batch_is_full() -> None:
    engine = make_engine(max_num_seqs=2)
    for i in range(5):
        engine.add_request(f"r{i}", prompt(4, 10 * i + 1), 3, 0.0)
    engine.advance(0.0)
    assert (engine.num_running, engine.num_waiting) == (2, 3)
    events = run(engine)
    order = [e.request_id for e in events if e.finished]
    assert order == ["r0", "r1", "r2", "r3", "r4"]
    assert (engine.num_running, engine.num_waiting) == (0, 0)


def test_latency_follows_prefill_and_decode_model_when_alone() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(100), 5, 0.0)
    events = run(engine)
    step = (10.0 + 1.0) / 1000  # base + per_seq * batch(1)
    ttft = step + 100 / 1000.0  # all prompt tokens uncached
    assert events[0].time == pytest.approx(ttft)
    assert events[-1].time == pytest.approx(ttft + 4 * step)
    assert engine.stats.ttft.count == 1
    assert engine.stats.itl.total == pytest.approx(4 * step)
    assert engine.stats.e2e.total == pytest.approx(ttft + 4 * step)


def test_ttft_shrinks_when_prompt_is_cached() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(100), 1, 0.0)
    cold = finished(run(engine))["a"].time
    engine.add_request("b", prompt(100), 1, 10.0)
    warm = finished(run(engine, 10.0))["b"].time - 10.0
    assert cold == pytest.approx(0.011 + 0.1)
    assert warm == pytest.approx(0.011 + 4 / 1000.0)  # 96 cached, 4 recomputed


def test_decode_step_grows_with_batch_when_requests_run_together() -> None:
    engine = make_engine(prefill_tokens_per_s=1e12)
    engine.add_request("a", prompt(4), 3, 0.0)
    engine.add_request("b", prompt(4, 50), 3, 0.0)
    done = finished(run(engine))
    assert done["a"].time == pytest.approx(3 * (10.0 + 2 * 1.0) / 1000)


def test_lora_request_waits_for_a_slot_when_max_loras_is_reached() -> None:
    engine = make_engine(lora_adapters=("a", "b"), max_loras=1)
    engine.add_request("la", prompt(4), 5, 0.0, lora="a")
    engine.add_request("lb", prompt(4, 20), 2, 0.0, lora="b")
    engine.add_request("base", prompt(4, 40), 2, 0.0)
    engine.advance(0.0)
    assert engine.running_loras() == ["a"]
    assert engine.waiting_loras() == ["b"]
    assert engine.num_running == 2  # the base-model request passes the blocked LoRA request
    done = finished(run(engine))
    assert done["lb"].time > done["la"].time
    assert done["base"].time < done["la"].time


def test_kv_usage_counts_referenced_blocks_when_requests_run() -> None:
    engine = make_engine(num_gpu_blocks=10)
    engine.add_request("a", prompt(10), 5, 0.0)  # 3 blocks
    engine.advance(0.0)
    assert engine.kv_usage == pytest.approx(3 / 10)
    run(engine)
    assert engine.kv_usage == 0.0
    assert engine.pool.cached_blocks == 3  # 2 prompt blocks + the block filled while decoding


def test_preempted_request_still_completes_when_kv_pool_runs_out() -> None:
    engine = make_engine(num_gpu_blocks=6, prefill_tokens_per_s=1e12)
    engine.add_request("a", prompt(4, 1), 12, 0.0)
    engine.add_request("b", prompt(4, 100), 12, 0.0)
    events = run(engine)
    assert engine.stats.preemptions >= 1
    per_request = {rid: [e.index for e in events if e.request_id == rid] for rid in ("a", "b")}
    assert per_request["a"] == list(range(12))
    assert per_request["b"] == list(range(12))
    assert engine.pool.used_blocks == 0


def test_abort_releases_blocks_when_request_is_running() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(20), 50, 0.0)
    engine.advance(0.0)
    assert engine.pool.used_blocks == 5
    assert engine.abort_request("a") is True
    assert engine.pool.used_blocks == 0
    assert engine.abort_request("a") is False
    assert engine.stats.finished["abort"] == 1


@pytest.mark.parametrize(
    ("changes", "prompt_len", "max_tokens", "match"),
    [
        pytest.param(
            {"max_model_len": 10},
            8,
            4,
            "This model's maximum context length is 1",
            id="context-window",
        ),
        pytest.param(
            {"num_gpu_blocks": 2}, 8, 4, "the request needs more than 2 KV blocks", id="kv-pool"
        ),
        pytest.param({}, 0, 4, "the prompt is empty", id="empty-prompt"),
    ],
)
def test_add_request_rejects_when_request_can_never_run(
    changes: dict[str, Any], prompt_len: int, max_tokens: int, match: str
) -> None:
    engine = make_engine(**changes)
    with pytest.raises(RequestRejected, match=match):
        engine.add_request("a", prompt(prompt_len), max_tokens, 0.0)


def test_finish_reason_is_stop_when_no_limit_was_requested() -> None:
    engine = make_engine(default_max_tokens=3)
    engine.add_request("a", prompt(4), None, 0.0)
    engine.add_request("b", prompt(4, 9), 3, 0.0)
    done = finished(run(engine))
    assert (done["a"].finish_reason, done["a"].index) == ("stop", 2)
    assert (done["b"].finish_reason, done["b"].index) == ("length", 2)


def test_kv_events_chain_blocks_and_report_removals_when_cache_churns() -> None:
    engine = make_engine(num_gpu_blocks=4)
    engine.add_request("a", prompt(9), 1, 0.0)
    run(engine)
    stored = engine.drain_kv_events()
    assert len(stored) == 1 and isinstance(stored[0], BlockStored)
    assert stored[0].parent_block_hash is None
    assert stored[0].token_ids == prompt(8)
    assert len(stored[0].block_hashes) == 2
    engine.add_request("b", prompt(12, 50), 1, 1.0)
    run(engine, 1.0)
    events = engine.drain_kv_events()
    removed = [e for e in events if isinstance(e, BlockRemoved)]
    assert [h for e in removed for h in e.block_hashes] == [stored[0].block_hashes[1]]
    assert engine.reset_prefix_cache() is True
    assert isinstance(engine.drain_kv_events()[-1], AllBlocksCleared)
    assert engine.pool.cached_blocks == 0


def test_decode_block_event_links_to_prompt_chain_when_block_fills() -> None:
    engine = make_engine()
    engine.add_request("a", prompt(6), 3, 0.0)  # prompt 6 + 2 decoded tokens fill block 2
    engine.advance(0.0)
    (prompt_event,) = engine.drain_kv_events()
    run(engine)
    (decode_event,) = engine.drain_kv_events()
    assert isinstance(prompt_event, BlockStored) and isinstance(decode_event, BlockStored)
    assert prompt_event.token_ids == [1, 2, 3, 4]
    assert decode_event.parent_block_hash == prompt_event.block_hashes[-1]
    assert decode_event.token_ids[:2] == [5, 6]
    assert len(decode_event.token_ids) == 4


def test_a_waiting_prompt_is_held_in_about_four_bytes_a_token() -> None:
    import tracemalloc

    engine = make_engine(max_num_seqs=1, num_gpu_blocks=100_000, max_model_len=8192)
    prompts = [[70_000 + 16 * i + t for t in range(4096)] for i in range(50)]  # ids past 2**16
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, ids in enumerate(prompts):
            engine.add_request(f"r{i}", ids, 8, 0.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert engine.num_waiting == 50
    # a list of ints would hold a pointer and an int object per token: about 36 bytes
    assert held / (50 * 4096) < 6


def test_prompt_ids_beyond_32_bits_are_kept_exactly() -> None:
    engine = make_engine(prefill_tokens_per_s=1e12)
    engine.add_request("big", [2**40 + 1, 5, 2**33], 2, 0.0)
    events = run(engine)
    assert [e.prompt_tokens for e in events] == [3, 3]
