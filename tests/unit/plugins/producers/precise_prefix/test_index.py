from __future__ import annotations

import gc
import itertools
import tracemalloc
from collections.abc import Iterator

import pytest

from epp.plugins.producers.precise_prefix.index import BYTES_PER_BLOCK, UNALIGNED, PreciseIndex

GPU = ("gpu", 0)
CPU = ("cpu", 0)
A, B, C = "ns/a", "ns/b", "ns/c"


def chain(start: int, n: int) -> list[int]:
    """Request keys of a synthetic chain."""
    return list(range(start, start + n))


def store(index: PreciseIndex, endpoint: str, keys: list[int], *, source=GPU, base=10_000) -> None:
    """Engine hash ``base + key`` maps 1:1 to request key ``key``."""
    index.add(endpoint, source, [(base + k, k) for k in keys])


class Counting:
    """An iterator that counts how many keys the index pulled."""

    def __init__(self, keys: list[int]) -> None:
        self.keys = keys
        self.pulled = 0

    def __iter__(self) -> Iterator[int]:
        for key in self.keys:
            self.pulled += 1
            yield key


def test_match_counts_consecutive_leading_keys_when_endpoints_hold_prefixes() -> None:
    index = PreciseIndex(1000)
    store(index, A, chain(1, 10))
    store(index, B, chain(1, 4))
    store(index, C, [1, 2, 5, 6])  # a hole at 3
    assert index.match(chain(1, 12)) == {A: 10, B: 4, C: 2}


def test_match_pulls_only_matched_keys_plus_one_when_chain_breaks() -> None:
    index = PreciseIndex(1000, owners_per_key=64)
    for i in range(50):  # many endpoints must not make the walk longer
        store(index, f"ns/p{i}", chain(1, 3))
    keys = Counting(chain(1, 10_000))
    assert index.match(keys) == {f"ns/p{i}": 3 for i in range(50)}
    assert keys.pulled == 4


def test_match_returns_nothing_when_first_key_unknown() -> None:
    index = PreciseIndex(1000)
    store(index, A, chain(2, 5))
    assert index.match(chain(1, 5)) == {}


def test_removal_releases_key_when_last_reference_goes() -> None:
    index = PreciseIndex(1000)
    # two engine hashes (e.g. salted / unsalted engine blocks) map to the same request key 1
    index.add(A, GPU, [(100, 1), (200, 1), (101, 2)])
    assert index.owners(1) == (A,)
    index.remove(A, GPU, [100])
    assert index.owners(1) == (A,)
    index.remove(A, GPU, [200, 101])
    assert index.owners(1) == () and index.owners(2) == ()
    assert index.entries == 0 and len(index) == 0


def test_repeated_store_is_indexed_once_and_needs_as_many_removals() -> None:
    index = PreciseIndex(1000)
    assert index.add(A, GPU, [(100, 1)]) == 1
    assert index.add(A, GPU, [(100, 1)]) == 0
    assert index.entries == 1
    assert index.remove(A, GPU, [100]) == 0  # one announcement still holds it
    assert index.owners(1) == (A,) and index.removals_suppressed == 1
    assert index.remove(A, GPU, [100]) == 1
    assert index.owners(1) == () and index.removals_suppressed == 1
    assert index.remove(A, GPU, [100]) == 0  # unknown now: passes, releases nothing
    assert index.removals_suppressed == 1


def test_removal_is_ignored_when_engine_hash_unknown() -> None:
    index = PreciseIndex(1000)
    store(index, A, [1])
    assert index.remove(A, GPU, [999]) == 0
    assert index.remove(B, GPU, [10_001]) == 0
    assert index.owners(1) == (A,)


def test_other_tier_keeps_key_when_gpu_copy_removed() -> None:
    index = PreciseIndex(1000)
    store(index, A, [1])
    store(index, A, [1], source=CPU)
    index.remove(A, GPU, [10_001])
    assert index.owners(1) == (A,)
    assert index.block_counts() == {A: {"cpu": 1}}
    index.remove(A, CPU, [10_001])
    assert index.owners(1) == ()


def test_clear_endpoint_forgets_only_that_endpoint_when_all_blocks_cleared() -> None:
    index = PreciseIndex(1000)
    store(index, A, chain(1, 5))
    store(index, B, chain(1, 5))
    assert index.clear_endpoint(A) == 5
    assert index.match(chain(1, 5)) == {B: 5}
    assert index.entries == 5


def test_retain_drops_endpoints_when_they_left_the_pool() -> None:
    index = PreciseIndex(1000)
    store(index, A, [1])
    store(index, B, [1])
    assert index.retain({B}) == [A]
    assert index.owners(1) == (B,)


def test_lru_evicts_least_recently_used_key_when_capacity_exceeded() -> None:
    index = PreciseIndex(3)
    store(index, A, [1, 2, 3])
    index.match([1])  # 1 is now the most recently used
    store(index, A, [4])
    assert [index.owners(k) for k in (1, 2, 3, 4)] == [(A,), (), (A,), (A,)]
    assert index.evictions == 1 and len(index) == 3
    assert index.remove(A, GPU, [10_002]) == 1  # the dangling mapping goes quietly
    assert index.entries == 3


def test_oldest_owner_is_dropped_when_key_has_too_many_owners() -> None:
    index = PreciseIndex(100, owners_per_key=2)
    for ep in (A, B, C):
        store(index, ep, [1])
    assert index.owners(1) == (B, C)
    assert index.entries == 2


def test_dangling_engine_mappings_are_swept_when_keys_keep_being_evicted() -> None:
    index = PreciseIndex(10)
    store(index, A, chain(0, 5000))
    assert len(index) == 10
    assert index.engine_mappings() < 2100  # swept in batches, never the 5000 stored


def test_parent_key_is_unaligned_when_engine_hash_ends_inside_a_block() -> None:
    index = PreciseIndex(100)
    index.add(A, GPU, [(100, 1), (101, 1)], mid={100})
    assert index.parent_key(A, GPU, 101) == 1
    assert index.parent_key(A, GPU, 100) is UNALIGNED
    with pytest.raises(KeyError, match="102"):
        index.parent_key(A, GPU, 102)
    with pytest.raises(KeyError, match="101"):
        index.parent_key(B, GPU, 101)


def test_speculative_keys_expire_when_ttl_passes() -> None:
    index = PreciseIndex(100)
    index.add_speculative(A, chain(1, 3), deadline=10.0)
    assert index.match(chain(1, 3)) == {A: 3}
    assert index.expire(9.9) == 0
    assert index.expire(10.0) == 1
    assert index.match(chain(1, 3)) == {}
    assert index.entries == 0


def test_speculative_keys_stay_when_confirmed_by_a_real_store() -> None:
    index = PreciseIndex(100)
    index.add_speculative(A, chain(1, 3), deadline=10.0)
    store(index, A, [1, 2])
    index.expire(11.0)
    assert index.match(chain(1, 3)) == {A: 2}
    assert index.block_counts() == {A: {"gpu": 2}}


def test_speculative_keys_overlapping_real_ones_are_not_lost_when_expiring() -> None:
    index = PreciseIndex(100)
    store(index, A, [1])
    index.add_speculative(A, [1, 2], deadline=1.0)
    index.expire(2.0)
    assert index.match([1, 2]) == {A: 1}


def _index_bytes(blocks: int, endpoints: int) -> float:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PreciseIndex(10 * blocks)
    counter = itertools.count(2**62)  # realistic 64-bit hashes: full-size ints
    keys = [next(counter) for _ in range(blocks)]
    for e in range(endpoints):
        engine = [next(counter) for _ in range(blocks)]
        index.add(f"default/pod-{e}-rank-0", GPU, list(zip(engine, keys, strict=True)))
    del keys, engine
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert index.entries == blocks * endpoints
    return (after - before) / index.entries


@pytest.mark.parametrize(
    "endpoints", [pytest.param(1, id="one-owner"), pytest.param(3, id="three-owners")]
)
def test_bytes_per_block_stays_under_estimate_when_measured(endpoints: int) -> None:
    measured = _index_bytes(20_000, endpoints)
    assert 100 < measured <= BYTES_PER_BLOCK
