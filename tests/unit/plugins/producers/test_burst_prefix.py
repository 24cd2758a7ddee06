"""``burst-prefix-cache-producer``: windows, joint placement, match info, parameters."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from epp.plugin import (
    DataProducer,
    PrefixMatchInfo,
    ProducerTimeout,
    Stability,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugins.producers.burst_assign import Entry, assign
from epp.plugins.producers.burst_prefix import BurstPrefixCacheProducer
from tests.builders import FakeHandle, make_endpoint, make_request

KEY = "PrefixCacheMatchInfo/burst-prefix-cache-producer"
TOKENS_KEY = "TokenizedPrompt/token-producer"
POOL = [make_endpoint(i) for i in range(3)]


def producer(h: FakeHandle | None = None, **params: Any) -> BurstPrefixCacheProducer:
    params.setdefault("windowDurationMs", 20)
    params.setdefault("blockSizeTokens", 4)
    decoded = decode(BurstPrefixCacheProducer.Params, params)
    return BurstPrefixCacheProducer(name="", params=decoded, handle=h or FakeHandle())


def entry(blocks: list[int], pods: list[Any] = POOL) -> Entry:
    """An entry whose one prompt has these block hashes (a chain: equal prefix = equal hashes)."""
    return Entry(([*blocks],) if blocks else (), pods)


def placed(entries: list[Entry]) -> list[str | None]:
    return [e.assigned for e in entries]


def request(tokens: list[int], model: str = "m") -> Any:
    prompt = TokenizedPrompt.from_token_ids([tokens])
    return make_request(target_model=model, attributes={TOKENS_KEY: prompt})


# ---- joint placement (pure) ---------------------------------------------------------------------


def test_identical_group_goes_whole_to_one_replica() -> None:
    group = [entry([1, 2, 3]) for _ in range(5)]
    assign(group, -1, 0, False)
    assert set(placed(group)) == {POOL[0].id}


def test_max_per_replica_spills_a_group_to_the_next_least_loaded() -> None:
    group = [entry([1, 2]) for _ in range(5)]
    assign(group, 2, 0, False)
    assert Counter(placed(group)) == {POOL[0].id: 2, POOL[1].id: 2, POOL[2].id: 1}


def test_distinct_groups_are_balanced_and_lone_requests_get_no_affinity() -> None:
    a = [entry([1, 2]) for _ in range(2)]
    b = [entry([7, 8, 9]) for _ in range(2)]
    lone = [entry([1, 5]), entry([])]
    assign([*a, *b, *lone], -1, 0, False)
    # the longer prefix is placed first, on the least loaded replica (ties: lower id)
    assert set(placed(b)) == {POOL[0].id}
    assert set(placed(a)) == {POOL[1].id}
    assert placed(lone) == [None, None]


def test_min_colocate_blocks_joins_requests_sharing_leading_blocks() -> None:
    pods = POOL[:2]
    longest = [entry([4, 5, 6, 7], pods) for _ in range(2)]  # placed first: pod-0
    group = [entry([1, 2, 3], pods) for _ in range(2)]  # then pod-1
    sharer, other = entry([1, 2, 9], pods), entry([8, 9], pods)
    assign([*group, sharer, other, *longest], -1, 2, False)
    assert set(placed(longest)) == {pods[0].id}
    assert set(placed(group)) == {pods[1].id}
    # equal load on both: the shared 2 leading blocks decide, within the fair share (3)
    assert sharer.assigned == pods[1].id
    assert other.assigned is None  # shares nothing with anyone
    again = [entry([1, 2, 3], pods) for _ in range(2)] + [entry([1, 2, 9], pods)]
    assign(again, -1, 0, False)
    assert again[2].assigned is None  # minColocateBlocks 0: only identical prompts


def test_fair_share_bounds_prefix_colocation() -> None:
    group = [entry([1, 2, 3]) for _ in range(2)]
    sharer = entry([1, 2, 9])
    assign([*group, sharer], -1, 2, False)
    # 3 requests over 3 replicas: a fair share of 1, which the group's replica already exceeds
    assert set(placed(group)) == {POOL[0].id}
    assert sharer.assigned == POOL[1].id


def test_fair_share_stops_prefix_units_stampeding_onto_one_replica() -> None:
    sharers = [entry([1, 2, i]) for i in range(10, 14)]  # four lone requests, one shared prefix
    assign(sharers, -1, 2, False)
    # fair share ceil(4 / 3) = 2: pairs co-locate, the third replica stays free of this prefix
    assert Counter(placed(sharers)) == {POOL[0].id: 2, POOL[1].id: 2}


def test_token_balancing_charges_blocks_not_requests() -> None:
    long_group = [entry(list(range(100, 110))) for _ in range(2)]  # 10 blocks
    short = [[entry([i, i + 1]) for _ in range(2)] for i in (1, 3, 5)]  # 2 blocks each
    assign([*long_group, *(e for g in short for e in g)], -1, 0, True)
    assert set(placed(long_group)) == {POOL[0].id}
    # the three short groups avoid the replica carrying 10 blocks
    assert {e.assigned for g in short for e in g} <= {POOL[1].id, POOL[2].id}


def test_ties_go_to_fewer_running_requests() -> None:
    pods = [make_endpoint(0, running=5), make_endpoint(1, running=1), make_endpoint(2, running=3)]
    group = [entry([1], pods) for _ in range(2)]
    assign(group, -1, 0, False)
    assert set(placed(group)) == {pods[1].id}


# ---- the producer -----------------------------------------------------------------------------


def test_plugin_is_alpha_producer_with_window_budget() -> None:
    check_plugin_class(BurstPrefixCacheProducer, "burst-prefix-cache-producer")
    assert BurstPrefixCacheProducer.STABILITY is Stability.ALPHA
    p = producer(windowDurationMs=100)
    assert isinstance(p, DataProducer) and isinstance(p, ProducerTimeout)
    assert p.produce_timeout() == pytest.approx(0.4)
    assert p.consumes() == {TOKENS_KEY}
    assert p.produces() == {KEY}


async def test_burst_within_a_window_lands_on_one_endpoint() -> None:
    p = producer()
    shared = list(range(40))
    reqs = [request(shared) for _ in range(4)] + [request(list(range(50, 90)))]
    await asyncio.gather(*(p.produce(r, POOL) for r in reqs))
    infos: list[dict[str, PrefixMatchInfo]] = [r.attributes[KEY] for r in reqs]
    full = PrefixMatchInfo(10, 10, 4)
    winners = [[ep for ep, i in info.items() if i == full] for info in infos[:4]]
    assert len({tuple(w) for w in winners}) == 1 and len(winners[0]) == 1
    assert all(i.match_blocks == 0 for i in infos[4].values())  # alone in its window
    assert p.dump_state()["windows"] == 1
    assert p.outcomes == {"colocated": 4, "unplaced": 1, "batch_full": 0}


async def test_requests_in_different_windows_are_placed_separately() -> None:
    p = producer(windowDurationMs=10)
    first = request(list(range(8)))
    await p.produce(first, POOL)
    second = request(list(range(8)))
    await p.produce(second, POOL)
    assert all(i.match_blocks == 0 for i in second.attributes[KEY].values())
    assert p.windows == 2


async def test_full_window_refuses_more_requests() -> None:
    h = FakeHandle()
    p = producer(h, maxBatchSize=2)
    reqs = [request([1, 2, 3, 4]) for _ in range(3)]
    results = await asyncio.gather(*(p.produce(r, POOL) for r in reqs), return_exceptions=True)
    assert isinstance(results[2], RuntimeError) and "maxBatchSize 2" in str(results[2])
    assert KEY not in reqs[2].attributes
    labels = {"plugin_name": p.TYPE, "outcome": "batch_full"}
    assert h.registry.get_sample_value("llm_d_epp_burst_prefix_requests_total", labels) == 1


async def test_request_without_prompt_scores_zero_everywhere() -> None:
    p = producer()
    req = make_request(target_model="m")
    await p.produce(req, POOL)
    assert set(req.attributes[KEY].values()) == {PrefixMatchInfo(0, 0, 4)}


def test_max_prefix_tokens_caps_the_blocks_hashed() -> None:
    p = producer(maxPrefixTokensToMatch=8)
    chains = p.hash_prompt("m", TokenizedPrompt.from_token_ids([list(range(40))]))
    assert [len(c) for c in chains] == [2]
    assert p.hash_prompt("m", None) == ()
    assert p.hash_prompt("m", TokenizedPrompt.from_token_ids([list(range(8))])) != p.hash_prompt(
        "other", TokenizedPrompt.from_token_ids([list(range(8))])
    )


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"windowDurationMs": 0}, "windowDurationMs must be > 0"),
        ({"windowDurationMs": 10001}, "windowDurationMs must be <= 10000"),
        ({"maxPerReplica": 0}, "maxPerReplica must be -1 (unlimited) or >= 1"),
        ({"blockSizeTokens": 0}, "blockSizeTokens must be > 0"),
        ({"maxPrefixTokensToMatch": -1}, "maxPrefixTokensToMatch must be >= 0"),
        ({"maxPrefixTokensToMatch": 10}, "must be 0 or >= blockSizeTokens (64)"),
        ({"minColocateBlocks": -1}, "minColocateBlocks must be >= 0"),
        ({"maxBatchSize": 0}, "maxBatchSize must be -1 (unlimited) or >= 1"),
        ({"balanceBy": "bytes"}, "balanceBy"),
        ({"windowMs": 5}, "unknown field"),
    ],
)
def test_invalid_parameters_fail_with_upstream_message(
    params: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(ParamError) as err:
        decode(BurstPrefixCacheProducer.Params, params)
    assert fragment in str(err.value)


def test_defaults_follow_upstream() -> None:
    p = decode(BurstPrefixCacheProducer.Params, None)
    assert (
        p.window_duration_ms,
        p.max_per_replica,
        p.block_size_tokens,
        p.max_prefix_tokens_to_match,
        p.min_colocate_blocks,
        p.max_batch_size,
        p.balance_by,
    ) == (100, -1, 64, 0, 0, 1000, "requests")
