from __future__ import annotations

import gc
import random
import struct
import tracemalloc

import pytest
import xxhash

from epp.plugins.producers.prefix_index import (
    BYTES_PER_BLOCK,
    PrefixIndex,
    _Run,
    _run_of,
    block_hashes,
    seed_hash,
)
from tests.builders import chained_adds


def _reference_hashes(
    tokens: list[int], block_tokens: int, model: str, salt: str, max_blocks: int | None
) -> list[int]:
    """Spec §4.8 written out plainly: one token at a time, one block at a time."""
    prev = xxhash.xxh64(model.encode() + salt.encode()).intdigest()
    out = []
    for start in range(0, len(tokens), block_tokens):
        if max_blocks is not None and len(out) >= max_blocks:
            break
        block = b"".join(struct.pack("<I", t) for t in tokens[start : start + block_tokens])
        content = xxhash.xxh64(block).intdigest()
        prev = xxhash.xxh64(struct.pack("<Q", content) + struct.pack("<Q", prev)).intdigest()
        out.append(prev)
    return out


def _pack(tokens: list[int]) -> bytes:
    return b"".join(struct.pack("<I", t) for t in tokens)


@pytest.mark.parametrize(
    ("n_tokens", "block_tokens", "max_blocks"),
    [
        pytest.param(0, 4, None, id="empty"),
        pytest.param(3, 4, None, id="one-partial-block"),
        pytest.param(8, 4, None, id="exact-blocks"),
        pytest.param(10, 4, None, id="partial-last-block"),
        pytest.param(200, 64, None, id="engine-sized"),
        pytest.param(40, 4, 3, id="capped"),
        pytest.param(40, 4, 0, id="cap-zero"),
    ],
)
def test_block_hashes_match_reference_when_cut_into_blocks(
    n_tokens: int, block_tokens: int, max_blocks: int | None
) -> None:
    tokens = [(i * 2654435761) % 2**32 for i in range(n_tokens)]
    expected = _reference_hashes(tokens, block_tokens, "model-a", "salt", max_blocks)
    got = block_hashes(_pack(tokens), block_tokens * 4, seed_hash("model-a", "salt"), max_blocks)
    assert got == expected


@pytest.mark.parametrize(
    ("other_model", "other_salt"),
    [
        pytest.param("model-b", "", id="model-separates"),
        pytest.param("model-a", "tenant-1", id="salt-separates"),
    ],
)
def test_block_hashes_share_nothing_when_model_or_salt_differs(
    other_model: str, other_salt: str
) -> None:
    tokens = _pack(list(range(64)))
    first = block_hashes(tokens, 64, seed_hash("model-a"), None)
    second = block_hashes(tokens, 64, seed_hash(other_model, other_salt), None)
    assert len(first) == len(second) == 4
    assert set(first).isdisjoint(second)


def test_block_hashes_share_nothing_when_first_block_differs() -> None:
    seed = seed_hash("m")
    base = list(range(64))
    changed = [999, *base[1:]]
    a = block_hashes(_pack(base), 64, seed, None)
    b = block_hashes(_pack(changed), 64, seed, None)
    assert set(a).isdisjoint(b)


def test_block_hashes_share_leading_blocks_when_only_tail_differs() -> None:
    seed = seed_hash("m")
    base = list(range(64))
    changed = [*base[:-1], 999]
    a = block_hashes(_pack(base), 64, seed, None)
    b = block_hashes(_pack(changed), 64, seed, None)
    assert a[:3] == b[:3]
    assert a[3] != b[3]


@pytest.mark.parametrize(
    ("holdings", "query", "expected"),
    [
        pytest.param({}, [1, 2, 3], {}, id="empty-index"),
        pytest.param({"a": [1, 2, 3]}, [1, 2, 3], {"a": 3}, id="full-match"),
        pytest.param({"a": [1, 2]}, [1, 2, 3, 4], {"a": 2}, id="prefix-match"),
        pytest.param({"a": [2, 3]}, [1, 2, 3], {}, id="first-block-missing"),
        pytest.param({"a": [1, 2, 3], "b": [1]}, [1, 2, 3], {"a": 3, "b": 1}, id="two-endpoints"),
        pytest.param(
            {"a": [1, 2, 4], "b": [1, 2, 3, 4]},
            [1, 2, 3, 4],
            {"a": 2, "b": 4},
            id="gap-ends-endpoint-run",
        ),
        pytest.param({"a": [1], "b": [2]}, [1, 2], {"a": 1}, id="late-joiner-ignored"),
        pytest.param({"a": []}, [], {}, id="empty-query"),
    ],
)
def test_match_counts_consecutive_leading_blocks_when_queried(
    holdings: dict[str, list[int]], query: list[int], expected: dict[str, int]
) -> None:
    index = PrefixIndex(100)
    for endpoint, hashes in holdings.items():
        index.add(endpoint, hashes)
    assert index.match(query) == expected


def test_add_evicts_least_recent_blocks_when_capacity_exceeded() -> None:
    index = PrefixIndex(4)
    index.add("a", [1, 2])
    index.add("a", [3, 4])
    index.add("a", [5, 6])
    assert index.size == 4
    assert index.owners(1) == ()
    assert index.owners(2) == ()
    assert index.match([3, 4]) == {"a": 2}
    assert index.match([5, 6]) == {"a": 2}


def test_add_keeps_chain_head_when_chain_longer_than_capacity() -> None:
    index = PrefixIndex(3)
    index.add("a", [1, 2, 3, 4, 5])
    assert index.block_counts() == {"a": 3}
    assert index.match([1, 2, 3, 4, 5]) == {"a": 3}


def test_add_evicts_tail_first_when_older_chain_is_pushed_out() -> None:
    index = PrefixIndex(4)
    index.add("a", [1, 2, 3])
    index.add("a", [7, 8])  # one block of the first chain must go: its tail, not its head
    assert index.match([1, 2, 3]) == {"a": 2}


def test_add_refreshes_recency_when_block_seen_again() -> None:
    index = PrefixIndex(2)
    index.add("a", [1])
    index.add("a", [2])
    index.add("a", [1])
    index.add("a", [3])
    assert index.owners(1) == ("a",)
    assert index.owners(2) == ()


def test_eviction_keeps_other_owner_when_block_shared() -> None:
    index = PrefixIndex(10)
    index.add("a", [1, 2], capacity=1)
    index.add("b", [1, 2])
    assert index.owners(1) == ("a", "b")
    assert index.owners(2) == ("b",)
    assert index.size == 3


def test_add_shrinks_endpoint_when_capacity_lowered() -> None:
    index = PrefixIndex(10)
    index.add("a", [1, 2, 3, 4])
    index.add("a", [], capacity=2)
    assert index.capacity("a") == 2
    assert index.size == 2
    assert index.match([1, 2, 3, 4]) == {"a": 2}


def test_remove_endpoint_drops_its_entries_when_called() -> None:
    index = PrefixIndex(10)
    index.add("a", [1, 2])
    index.add("b", [1])
    index.remove_endpoint("a")
    index.remove_endpoint("never-seen")
    assert index.endpoints() == ["b"]
    assert index.owners(1) == ("b",)
    assert index.owners(2) == ()
    assert index.size == 1
    assert len(index) == 1


def test_retain_purges_endpoints_when_no_longer_live() -> None:
    index = PrefixIndex(10)
    for endpoint in ("a", "b", "c"):
        index.add(endpoint, [1, 2])
    gone = index.retain({"b"})
    assert sorted(gone) == ["a", "c"]
    assert index.block_counts() == {"b": 2}
    assert index.match([1, 2]) == {"b": 2}


def test_size_stays_bounded_when_many_chains_added() -> None:
    index = PrefixIndex(50)
    for i in range(200):
        for endpoint in ("a", "b"):
            index.add(endpoint, [i * 10 + j for j in range(7)])
    assert index.size == 100
    assert len(index) <= 100
    assert index.approx_bytes() == 100 * BYTES_PER_BLOCK


def test_constructor_rejects_capacity_when_not_positive() -> None:
    with pytest.raises(ValueError, match="default_capacity"):
        PrefixIndex(0)


class _PlainIndex:
    """The index's rules written out plainly: one list per endpoint, one eviction per insert."""

    def __init__(self, default_capacity: int) -> None:
        self.default = default_capacity
        self.lrus: dict[str, list[int]] = {}  # oldest first
        self.caps: dict[str, int] = {}

    def add(self, endpoint: str, hashes: list[int], capacity: int | None) -> None:
        lru = self.lrus.setdefault(endpoint, [])
        if capacity:
            self.caps[endpoint] = capacity
        cap = self.caps.get(endpoint, self.default)
        del lru[: max(0, len(lru) - cap)]
        for h in reversed(hashes[:cap]):
            if h in lru:
                lru.remove(h)
            lru.append(h)
            del lru[: max(0, len(lru) - cap)]

    def owners(self, h: int) -> set[str]:
        return {ep for ep, lru in self.lrus.items() if h in lru}


def test_add_and_removal_match_the_plain_rules_when_driven_by_chains() -> None:
    rng = random.Random(7)
    index, plain = PrefixIndex(40, stride=1), _PlainIndex(40)
    endpoints = ["a", "b", "c", "d"]
    for ep, chain in chained_adds(rng, 4000, endpoints):
        if rng.random() < 0.02:
            index.remove_endpoint(ep)
            plain.lrus.pop(ep, None)
            plain.caps.pop(ep, None)
            continue
        capacity = rng.choice([None, None, None, 15, 40, 60])
        index.add(ep, chain, capacity)
        plain.add(ep, chain, capacity)
        assert {e: index.recency(e) for e in index.endpoints()} == plain.lrus
        _check_consistent(index)
    for h in range(max(max(lru, default=0) for lru in plain.lrus.values()) + 1):
        assert set(index.owners(h)) == plain.owners(h)
    assert index.size == sum(len(lru) for lru in plain.lrus.values())
    assert index.block_counts() == {ep: len(lru) for ep, lru in plain.lrus.items()}


class _PlainStrided:
    """The strided rules written out plainly: the indexed blocks of each chain (the first
    ``dense``, then the last of each group of ``stride``) in one list per endpoint, each weighing
    the blocks it stands for; the least recent go until the weights fit the capacity."""

    def __init__(self, default_capacity: int, dense: int, stride: int) -> None:
        self.default, self.dense, self.stride = default_capacity, dense, stride
        self.lrus: dict[str, list[int]] = {}  # oldest first
        self.caps: dict[str, int] = {}
        self.weight: dict[int, int] = {}

    def add(self, endpoint: str, hashes: list[int], capacity: int | None) -> None:
        lru = self.lrus.setdefault(endpoint, [])
        if capacity:
            self.caps[endpoint] = capacity
        cap = self.caps.get(endpoint, self.default)
        for i, h in reversed(list(enumerate(hashes[:cap]))):
            if i < self.dense or (i - self.dense) % self.stride == self.stride - 1:
                if h in lru:
                    lru.remove(h)
                lru.append(h)
                self.weight[h] = 1 if i < self.dense else self.stride
        while sum(self.weight[h] for h in lru) > cap:
            lru.pop(0)


def test_a_strided_index_matches_the_plain_rules_when_driven_by_chains() -> None:
    rng = random.Random(11)
    index, plain = PrefixIndex(40, dense=2, stride=3), _PlainStrided(40, 2, 3)
    for ep, chain in chained_adds(rng, 4000, ["a", "b", "c"]):
        capacity = rng.choice([None, None, None, 15, 40, 60])
        index.add(ep, chain, capacity)
        plain.add(ep, chain, capacity)
        assert {e: index.recency(e) for e in index.endpoints()} == plain.lrus
        _check_consistent(index)
        for e, lru in plain.lrus.items():
            assert index.block_counts()[e] == sum(plain.weight[h] for h in lru)


def test_a_long_match_is_reported_to_the_last_whole_group() -> None:
    index = PrefixIndex(1000)  # the defaults: 16 blocks, then groups of 8
    chain = list(range(100, 140))  # 40 blocks: 16 + 3 groups (16-23, 24-31, 32-39)
    index.add("e", chain)
    assert index.entries == 19 and index.size == 40 == index.block_counts()["e"]
    assert index.match(chain) == {"e": 40}
    assert index.match(chain[:39]) == {"e": 32} == {"e": index.reachable(39)}
    assert index.match(chain[:10]) == {"e": 10}  # the dense head is exact
    index.add("e", [*chain[:30], 7, 8])  # a fork inside the third group: its own entries
    assert index.match([*chain[:30], 7, 8]) == {"e": 32}
    assert index.match([*chain[:30], 7]) == {"e": 24}


def test_a_strided_endpoint_evicts_whole_entries_until_its_blocks_fit() -> None:
    index = PrefixIndex(40)
    index.add("e", list(range(100, 140)))  # 40 blocks: full
    index.add("e", [1, 2])  # 2 more: the last group (8 blocks) goes
    assert index.block_counts()["e"] == 34 and index.match(list(range(100, 140))) == {"e": 32}
    _check_consistent(index)


def _check_consistent(index: PrefixIndex) -> None:
    held = {ep: index.recency(ep) for ep in index.endpoints()}
    counts = index.block_counts()
    for ep, blocks in held.items():
        assert len(blocks) == len(set(blocks)) and counts[ep] <= index.capacity(ep)
    assert index.entries == sum(map(len, held.values()))
    assert index.size == sum(counts.values())
    every = {h for blocks in held.values() for h in blocks}
    assert len(index) == len(every)
    for h in every:
        assert set(index.owners(h)) == {ep for ep, blocks in held.items() if h in blocks}
    for h, where in index._at.items():  # a block maps to its run, or one run per endpoint
        runs = (where,) if isinstance(where, _Run) else where
        assert len(runs) == len({run.owner for run in runs}) and (
            runs is not where or len(runs) > 1
        )
        assert all(h in run.blocks and run in run.owner.runs for run in runs)
    for ep in held:  # each block in one run, which the map names; the runs' links both ways
        own = index._held[ep]
        weight = sum(
            index.blocks(run.base + len(run.blocks)) - index.blocks(run.base) for run in own.runs
        )
        assert own.weight == counts[ep] == weight
        order = {run: i for i, run in enumerate(own.runs)}  # least recent first
        for run in own.runs:
            assert run.owner is own and run.blocks
            assert all(_run_of(index._at[h], own) is run for h in run.blocks)
            below = [r for r in own.runs if r.parent is run]
            assert run.children == len(below) and all(order[r] < order[run] for r in below)
            assert run.parent is None or run.parent in order


def test_input_that_is_not_chained_keeps_the_index_consistent_and_bounded() -> None:
    rng = random.Random(7)
    index = PrefixIndex(12)
    endpoints = ["a", "b", "c", "d"]
    for _ in range(3000):
        ep = rng.choice(endpoints)
        if rng.random() < 0.03:
            index.remove_endpoint(ep)
            continue
        start = rng.randrange(40)  # overlapping ranges: a block shows up at many depths
        chain = [rng.randrange(start, start + 20) for _ in range(rng.randrange(20))]
        index.add(ep, chain, rng.choice([None, None, None, 5, 12, 20]))
        _check_consistent(index)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chains_mixed_with_input_that_is_not_chained_keep_the_index_consistent(seed: int) -> None:
    rng = random.Random(seed)
    index = PrefixIndex(rng.choice([5, 12, 30]))
    adds = chained_adds(rng, 1500, ["a", "b", "c"])
    for ep, chain in adds:
        roll = rng.random()
        if roll < 0.05:
            index.remove_endpoint(ep)
            continue
        if roll < 0.35:  # block ids that chained_adds also hands out, at any depth
            chain = [rng.randrange(150) for _ in range(rng.randrange(25))]
        index.add(ep, chain, rng.choice([None, None, 3, 12, 40]))
        _check_consistent(index)


def test_a_block_held_at_another_depth_is_not_taken_for_the_head() -> None:
    # 5 is held as the fourth block, so [1, 2, 3, 4, 5] is no chain of this index: 2 is added,
    # the rest stays as it was
    index = PrefixIndex(10)
    index.add("e", [1, 3, 4, 5])
    index.add("e", [1, 2, 3, 4, 5])
    assert index.recency("e") == [5, 4, 3, 1, 2]
    assert index.owners(2) == ("e",) and index.size == 5
    _check_consistent(index)


def test_a_block_of_the_head_repeated_in_the_tail_is_not_added_twice() -> None:
    index = PrefixIndex(10)
    index.add("e", [1, 2])
    index.add("e", [1, 2, 5, 1])  # the run ending at 2 is extended in place, by 5 only
    assert index.recency("e") == [5, 2, 1] and index.size == 3
    _check_consistent(index)


def test_a_known_chain_only_refreshes_its_blocks() -> None:
    index = PrefixIndex(10)
    index.add("e", [1, 2, 3])
    index.add("e", [7, 8])
    index.add("e", [1, 2, 3, 4])  # the next turn: 1-3 known, 4 new
    assert index.recency("e") == [8, 7, 4, 3, 2, 1] and index.size == 6


def test_a_fork_splits_the_run_it_leaves_and_eviction_takes_the_oldest_branch() -> None:
    index = PrefixIndex(5)
    index.add("e", [1, 2, 3, 4])
    index.add("e", [1, 2, 5])  # a sub-agent forks after block 2
    assert index.recency("e") == [4, 3, 5, 2, 1]
    index.add("e", [9, 10])  # two blocks must go: the old branch's tail, 4 then 3
    assert index.recency("e") == [5, 2, 1, 10, 9]
    assert index.match([1, 2, 3, 4]) == {"e": 2} and index.match([1, 2, 5]) == {"e": 3}
    _check_consistent(index)


def test_a_block_one_endpoint_holds_maps_to_its_run_and_a_shared_one_to_a_run_each() -> None:
    index = PrefixIndex(100)
    index.add("a", [1, 2, 3])
    index.add("b", [2, 3])
    assert isinstance(index._at[1], _Run) and index.owners(1) == ("a",)
    assert index.owners(2) == index.owners(3) == ("a", "b")
    assert [run.owner.alone for run in index._at[2]] == [("a",), ("b",)]  # type: ignore[union-attr]
    index.remove_endpoint("a")
    assert isinstance(index._at[2], _Run) and index.owners(2) == index.owners(3) == ("b",)
    assert 1 not in index._at
    _check_consistent(index)


def test_bytes_per_block_stays_under_estimate_when_measured() -> None:
    rng = random.Random(3)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = PrefixIndex(10**6, stride=1)
        for _ in range(100):  # 64-bit hashes, as xxh64 gives them (the ints are the index's)
            index.add("default/pod-0", [rng.getrandbits(64) | 1 << 63 for _ in range(1000)])
        gc.collect()
        measured = (tracemalloc.get_traced_memory()[0] - before) / index.size
    finally:
        tracemalloc.stop()
    assert 80 < measured <= BYTES_PER_BLOCK
