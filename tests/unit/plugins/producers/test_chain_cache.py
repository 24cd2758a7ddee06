"""``ChainCache``: a prompt that extends a recent one hashes only its new blocks, and the chain is
always the one ``block_hashes`` gives."""

from __future__ import annotations

import random

import pytest

from epp.plugins.producers.prefix_index import ChainCache, block_hashes

BLOCK = 256  # 64 tokens of 4 bytes


def _bytes(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


def test_an_agents_turns_hash_only_what_they_add() -> None:
    rng = random.Random(1)
    cache = ChainCache(min_blocks=0)
    context = _bytes(rng, 40 * BLOCK + 100)  # a partial last block
    assert cache.hashes(context, BLOCK, 7, None) == block_hashes(context, BLOCK, 7, None)
    assert (cache.hits, cache.misses) == (0, 1)
    for _ in range(5):
        context += _bytes(rng, rng.randrange(1, 5 * BLOCK))
        assert cache.hashes(context, BLOCK, 7, None) == block_hashes(context, BLOCK, 7, None)
    assert (cache.hits, cache.misses) == (5, 1)
    assert len(cache) == 1  # each turn took the place of the one it extended


def test_a_prompt_that_differs_inside_a_cached_one_is_hashed_whole() -> None:
    rng = random.Random(2)
    cache = ChainCache(min_blocks=0)
    base = _bytes(rng, 20 * BLOCK)
    cache.hashes(base, BLOCK, 7, None)
    edited = base[: 5 * BLOCK] + b"x" + base[5 * BLOCK + 1 :] + _bytes(rng, BLOCK)
    assert cache.hashes(edited, BLOCK, 7, None) == block_hashes(edited, BLOCK, 7, None)
    shorter = base[: 10 * BLOCK]  # a prefix of a cached prompt: nothing cached begins it
    assert cache.hashes(shorter, BLOCK, 7, None) == block_hashes(shorter, BLOCK, 7, None)
    assert cache.hits == 0


@pytest.mark.parametrize(("seed", "block"), [(8, BLOCK), (7, 2 * BLOCK)])
def test_another_seed_or_block_size_never_reuses_a_chain(seed: int, block: int) -> None:
    rng = random.Random(3)
    cache = ChainCache(min_blocks=0)
    base = _bytes(rng, 20 * BLOCK)
    cache.hashes(base, BLOCK, 7, None)
    longer = base + _bytes(rng, 3 * BLOCK)
    assert cache.hashes(longer, block, seed, None) == block_hashes(longer, block, seed, None)
    assert cache.hits == 0


def test_the_longest_cached_prompt_is_taken_and_caps_hold() -> None:
    rng = random.Random(4)
    cache = ChainCache(min_blocks=0)
    system = _bytes(rng, 4 * BLOCK)
    sessions = [system + _bytes(rng, rng.randrange(1, 30 * BLOCK)) for _ in range(6)]
    for prompt in sessions:
        cache.hashes(prompt, BLOCK, 7, None)
    for prompt in sessions:
        for cap in (None, 3, 12, 40):
            longer = prompt + _bytes(rng, 2 * BLOCK)
            assert cache.hashes(longer, BLOCK, 7, cap) == block_hashes(longer, BLOCK, 7, cap)


def test_random_conversations_always_give_block_hashes_chain() -> None:
    rng = random.Random(5)
    cache = ChainCache(max_bytes=64 * BLOCK, max_entries=8, min_blocks=0)
    contexts = [_bytes(rng, rng.randrange(0, 10 * BLOCK)) for _ in range(12)]
    for _ in range(600):
        i = rng.randrange(len(contexts))
        step = rng.random()
        if step < 0.6:  # the next turn
            contexts[i] += _bytes(rng, rng.randrange(0, 3 * BLOCK))
        elif step < 0.8:  # an edit somewhere
            cut = rng.randrange(len(contexts[i]) + 1)
            contexts[i] = contexts[i][:cut] + _bytes(rng, rng.randrange(0, BLOCK))
        block = rng.choice((BLOCK, BLOCK // 2))
        seed = rng.choice((7, 9))
        cap = rng.choice((None, None, 5, 20))
        got = cache.hashes(contexts[i], block, seed, cap)
        assert got == block_hashes(contexts[i], block, seed, cap)
        assert len(cache) <= 8
    assert cache.hits > 50


def test_it_holds_at_most_its_budget_and_never_a_prompt_over_it() -> None:
    rng = random.Random(6)
    cache = ChainCache(max_bytes=10 * BLOCK, max_entries=3, min_blocks=0)
    for _ in range(5):
        cache.hashes(_bytes(rng, 3 * BLOCK), BLOCK, 7, None)
    assert len(cache) == 3
    cache.hashes(_bytes(rng, 5 * BLOCK), BLOCK, 7, None)
    assert len(cache) == 2  # 3 + 3 + 5 blocks is over 10: the oldest went
    huge = _bytes(rng, 11 * BLOCK)
    cache.hashes(huge, BLOCK, 7, None)
    assert len(cache) == 2  # over the budget alone: hashed, not kept
    cache.clear()
    assert len(cache) == 0


def test_a_mutable_buffer_is_hashed_and_never_kept() -> None:
    cache = ChainCache(min_blocks=0)
    data = bytearray(random.Random(7).randbytes(5 * BLOCK))
    assert cache.hashes(data, BLOCK, 7, None) == block_hashes(bytes(data), BLOCK, 7, None)  # type: ignore[arg-type]
    assert len(cache) == 0
    data[0] ^= 1  # no view of it is held: it may still change


def test_short_prompts_are_hashed_without_the_cache() -> None:
    rng = random.Random(8)
    cache = ChainCache(min_blocks=10)
    short = _bytes(rng, 9 * BLOCK + 10)  # under 10 whole blocks
    assert cache.hashes(short, BLOCK, 7, None) == block_hashes(short, BLOCK, 7, None)
    assert len(cache) == 0 and (cache.hits, cache.misses) == (0, 0)
    long = short + _bytes(rng, 2 * BLOCK)
    cache.hashes(long, BLOCK, 7, None)
    assert len(cache) == 1 and cache.misses == 1
    capped = long + _bytes(rng, BLOCK)
    assert cache.hashes(capped, BLOCK, 7, 5) == block_hashes(capped, BLOCK, 7, 5)  # cap: short
    assert len(cache) == 1 and cache.misses == 1
