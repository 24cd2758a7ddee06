"""``approx-prefix-cache-producer`` as ``SharedState``: what it exports after PreRequest, how
another replica's facts land in its index, and the bounds."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epp.plugin import (
    Endpoint,
    ProfileResult,
    SchedulingResult,
    SharedState,
    TokenizedPrompt,
)
from epp.plugin.params import decode
from epp.plugins.producers import approx_prefix
from epp.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.plugins.producers.prefix_index import PendingBlocks, PrefixIndex
from tests.builders import FakeHandle, chained_adds, make_endpoint, make_request

TOKENS_KEY = "TokenizedPrompt/token-producer"
KEY = "PrefixCacheMatchInfo/approx-prefix-cache-producer"


def producer(registry: CollectorRegistry | None = None, **params: Any) -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(
        name="",
        params=decode(ApproxPrefixCacheProducer.Params, params),
        handle=FakeHandle(registry=registry or CollectorRegistry()),
    )


def request(n_tokens: int, first: int = 0) -> Any:
    prompt = TokenizedPrompt.from_token_ids([[first, *range(1, n_tokens)]])
    return make_request(target_model="m", attributes={TOKENS_KEY: prompt})


async def schedule(p: ApproxPrefixCacheProducer, req: Any, pool: list[Endpoint], i: int) -> None:
    await p.produce(req, pool)
    result = SchedulingResult(
        profile_results={"default": ProfileResult(targets=(pool[i],))}, primary_profile="default"
    )
    p.pre_request(req, result)


async def matches(p: ApproxPrefixCacheProducer, req: Any, pool: list[Endpoint]) -> dict[str, int]:
    await p.produce(req, pool)
    return {ep: info.match_blocks for ep, info in req.attributes[KEY].items()}


POOL = [make_endpoint(i) for i in range(3)]


async def test_it_is_shared_state_and_buffers_nothing_until_a_syncer_asks() -> None:
    p = producer()
    assert isinstance(p, SharedState)
    await schedule(p, request(640), POOL, 1)
    assert p.export_facts() == []  # the first call starts the buffering
    await schedule(p, request(640), POOL, 1)
    (fact,) = p.export_facts()
    endpoint, capacity, hashes, stride = fact
    assert (endpoint, capacity, len(hashes), stride) == (POOL[1].id, 31250, 10, 8)
    assert p.export_facts() == []


async def test_facts_learned_by_one_replica_make_the_other_match_the_same_endpoint() -> None:
    a, b = producer(), producer()
    a.export_facts()
    await schedule(a, request(640), POOL, 2)
    b.apply_facts(a.export_facts(), "replica-a")
    assert await matches(b, request(640), POOL) == {POOL[0].id: 0, POOL[1].id: 0, POOL[2].id: 10}
    assert b.export_facts() == []  # applied facts are not exported again (no echo)


async def test_a_repeated_chain_is_sent_once_after_the_others() -> None:
    a, b = producer(), producer()
    a.export_facts()
    await schedule(a, request(640, first=1), POOL, 0)
    await schedule(a, request(320, first=2), POOL, 0)
    await schedule(a, request(640, first=1), POOL, 0)  # again: sent once, as the newest
    facts = a.export_facts()
    assert [len(hashes) for _, _, hashes, _ in facts] == [5, 10]
    b.apply_facts(facts, "replica-a")
    # the receiving index has the same recency order, so it evicts the same blocks first
    assert b.index.recency(POOL[0].id) == a.index.recency(POOL[0].id)


async def test_duplicates_and_reordering_leave_the_same_blocks() -> None:
    a, b = producer(), producer()
    a.export_facts()
    await schedule(a, request(640, first=1), POOL, 0)
    first = a.export_facts()
    await schedule(a, request(640, first=2), POOL, 1)
    second = a.export_facts()
    for facts in (second, first, second, first):
        b.apply_facts(facts, "replica-a")
    assert b.index.size == a.index.size == 20
    assert b.index.block_counts() == a.index.block_counts()


async def test_applied_facts_respect_the_endpoint_capacity() -> None:
    b = producer()
    b.apply_facts([[POOL[0].id, 4, list(range(100, 110))]], "replica-a")
    assert b.index.block_counts() == {POOL[0].id: 4}
    assert b.index.owners(100) == (POOL[0].id,)  # the head of the chain is kept
    assert b.index.owners(109) == ()


async def test_the_capacity_comes_from_the_scraped_cache_of_the_endpoint() -> None:
    a = producer()
    ep = make_endpoint(0)
    assert ep.metrics is not None
    small = dataclasses.replace(
        ep, metrics=dataclasses.replace(ep.metrics, cache_num_blocks=40, cache_block_size=16)
    )
    a.export_facts()
    await schedule(a, request(640), [small], 0)
    ((_, capacity, _, _),) = a.export_facts()
    assert capacity == 10  # 40 engine blocks of 16 tokens = 10 index blocks of 64


async def test_malformed_facts_are_reported_after_the_valid_ones_are_applied() -> None:
    b = producer()
    bad: list[Any] = [
        "nope",
        [POOL[0].id, 0, [1]],
        [POOL[0].id, 5, [-1]],
        [POOL[0].id, 5, [2**64]],
        [POOL[0].id, True, [1]],
        ["", 5, [1]],
        [POOL[0].id, 5, "123"],
        [POOL[0].id, 5, [1, 2.5]],
        [POOL[0].id, 5, [1, "2"]],
        [POOL[0].id, 5, [1], 0],
        [POOL[0].id, 5, [1], "8"],
    ]
    with pytest.raises(ValueError, match="11 of 12 facts from replica-a are malformed"):
        b.apply_facts([*bad, [POOL[1].id, 5, [1, 2]]], "replica-a")
    assert b.index.block_counts() == {POOL[1].id: 2}


async def test_pending_blocks_are_bounded_oldest_dropped_and_counted(monkeypatch) -> None:
    monkeypatch.setattr(approx_prefix, "MAX_PENDING_BLOCKS", 15)
    registry = CollectorRegistry()
    a = producer(registry)
    a.export_facts()
    await schedule(a, request(640, first=1), POOL, 0)
    await schedule(a, request(640, first=2), POOL, 1)
    facts = a.export_facts()
    assert [(ep, len(h)) for ep, _, h, _ in facts] == [(POOL[1].id, 10), (POOL[0].id, 5)]
    dropped = registry.get_sample_value(
        "llm_d_epp_prefix_indexer_sync_dropped_blocks_total",
        {"plugin_name": "approx-prefix-cache-producer", "plugin_type": a.TYPE},
    )
    assert dropped == 5
    assert a.dump_state()["pendingBlocks"] == 0


def test_pending_blocks_drain_mirrors_the_index_order() -> None:
    pending, index = PendingBlocks(100), PrefixIndex(100)
    for ep, chain in (("e1", [1, 2, 3]), ("e2", [7, 8]), ("e1", [1, 2, 4])):
        pending.add(ep, chain, 100)
        index.add(ep, chain, 100)
    facts = pending.drain()
    assert facts == [["e1", 100, [1, 2, 3]], ["e1", 100, [1, 2, 4]], ["e2", 100, [7, 8]]]
    replica = PrefixIndex(100)
    for ep, capacity, chain in facts:
        replica.add(ep, chain, capacity)
    assert replica.recency("e1") == index.recency("e1")
    assert len(pending) == 0


def test_drained_chains_leave_a_replica_as_the_routing_index_when_driven_at_random() -> None:
    rng = random.Random(5)
    for _ in range(100):
        pending, index, replica = PendingBlocks(10_000), PrefixIndex(60), PrefixIndex(60)
        for ep, chain in chained_adds(rng, rng.randrange(1, 40), ["e0", "e1", "e2"]):
            pending.add(ep, chain, 60)
            index.add(ep, chain, 60)
        facts = pending.drain()
        for ep, capacity, chain in facts:
            replica.add(ep, chain, capacity)
        assert {ep: replica.recency(ep) for ep in index.endpoints()} == {
            ep: index.recency(ep) for ep in index.endpoints()
        }
        for i, (ep, _, chain) in enumerate(facts):  # none is a prefix of a later one
            later = [c for e, _, c in facts[i + 1 :] if e == ep]
            assert not any(c[: len(chain)] == chain for c in later)


def test_pending_blocks_keep_a_copy_of_the_chain() -> None:
    pending, chain = PendingBlocks(100), [1, 2, 3]
    pending.add("e1", chain, 100)
    chain.append(4)
    assert pending.drain() == [["e1", 100, [1, 2, 3]]]


def test_pending_blocks_fold_and_drop_before_a_drain_past_twice_the_bound() -> None:
    drops: list[int] = []
    pending = PendingBlocks(15, on_drop=drops.append)
    for first in range(3):
        pending.add(f"e{first}", list(range(first * 10, first * 10 + 10)), 100)
    assert drops == []  # 30 pairs kept: not past twice the bound yet
    pending.add("e0", list(range(10)), 100)  # a repeat: still 30 distinct pairs
    assert drops == [15]  # folded at 40 kept, then the oldest 15 dropped
    assert [(ep, len(h)) for ep, _, h in pending.drain()] == [("e0", 10), ("e2", 5)]


async def test_new_blocks_ask_for_prompt_sharing_and_a_full_hit_does_not() -> None:
    p = producer()
    handle = p.handle
    assert isinstance(handle, FakeHandle)
    await schedule(p, request(640), POOL, 1)
    assert handle.shared_soon == 0  # no syncer asked yet: nothing to share
    p.export_facts()
    await schedule(p, request(640, first=7), POOL, 1)  # a new prompt
    assert handle.shared_soon == 1
    await schedule(p, request(640, first=7), POOL, 1)  # all its blocks are there already
    assert handle.shared_soon == 1
    await schedule(p, request(640, first=7), POOL, 2)  # new to that endpoint
    assert handle.shared_soon == 2


async def test_a_full_hit_of_a_long_prompt_does_not_ask_for_prompt_sharing() -> None:
    p = producer()
    handle = p.handle
    assert isinstance(handle, FakeHandle)
    p.export_facts()
    await schedule(p, request(39 * 64, first=7), POOL, 1)  # 39 blocks: 16 + 2 whole groups
    assert handle.shared_soon == 1
    await schedule(p, request(39 * 64, first=7), POOL, 1)  # matched to its last whole group
    assert handle.shared_soon == 1


async def test_a_long_chain_is_sent_as_its_indexed_blocks_and_applied_as_routed() -> None:
    a, b = producer(), producer()
    a.export_facts()
    await schedule(a, request(200 * 64, first=3), POOL, 2)  # 200 blocks: 16 + 23 groups of 8
    (fact,) = a.export_facts()
    assert (len(fact[2]), fact[3]) == (16 + 23, 8)
    b.apply_facts([fact], "replica-a")
    assert b.index.recency(POOL[2].id) == a.index.recency(POOL[2].id)
    assert await matches(b, request(200 * 64, first=3), POOL) == {
        POOL[0].id: 0,
        POOL[1].id: 0,
        POOL[2].id: 200,
    }


async def test_a_whole_chain_without_a_stride_is_indexed_on_arrival() -> None:
    b = producer()
    b.apply_facts([[POOL[0].id, 1000, list(range(1, 41))]], "replica-a")  # 40 blocks
    assert b.index.block_counts() == {POOL[0].id: 40} and b.index.entries == 19


async def test_facts_of_another_stride_are_skipped_and_said() -> None:
    b = producer()
    with pytest.raises(ValueError, match=r"1 of 2 facts from replica-a were skipped.*indexStride"):
        b.apply_facts([[POOL[0].id, 100, [1, 2], 4], [POOL[1].id, 100, [5, 6], 8]], "replica-a")
    assert b.index.block_counts() == {POOL[1].id: 2}
