"""Prefix block hashing and the approximate prefix index (pure, synchronous, bounded).

Hashing (spec §4.8). A prompt's token ids, packed as little-endian ``uint32`` bytes, are cut into
blocks of ``block_size`` tokens (the last block may be partial)::

    seed      = xxh64(target_model bytes ‖ cache_salt bytes)
    content_i = xxh64(block_i bytes)
    hash_i    = xxh64(LE64(content_i) ‖ LE64(hash_{i-1}))      with hash_{-1} = seed

so a block's hash identifies the whole prefix up to and including it: two prompts that differ in
their first block share no hash at all, and different models or cache salts never collide.

Index. ``hash → endpoints holding it`` plus, per endpoint, an LRU of its blocks bounded by that
endpoint's capacity (in blocks), kept as runs of consecutive blocks of one chain (a turn costs
its new blocks and the runs on its path, not its length). Evicting a block from an endpoint's
LRU removes the endpoint from the block's owners, so memory is at most ``sum(capacities)``
entries (``approx_bytes`` estimates it); endpoints that left the pool are dropped with ``retain``.
``match`` costs O(matched blocks): it walks the request's hashes in order and stops at the first
block no endpoint holds.

Sharing. ``PendingBlocks`` buffers the chains the index learned since the last export, per
endpoint in the order they came, for the replicas that apply them (``epp.plugin.sharing``).
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import repeat
from typing import Any, Final

from xxhash import xxh64_intdigest

BYTES_PER_BLOCK: Final = 150
"""Estimated memory of one (endpoint, block) entry. Measured with ``tracemalloc`` on CPython 3.11
(64-bit hashes, the hash ints counted): about 149 bytes for a block held by one endpoint (its
slots in the endpoint's block-to-run map, in its run's list and in the owners map, and the hash
int; the owner tuple is shared) and about 61 for each further endpoint holding it. With one
ordered-dict LRU per endpoint it was 195."""

DENSE_BLOCKS: Final = 16
"""A chain's first blocks, each indexed (1,024 tokens in 64-token blocks)."""
STRIDE: Final = 8
"""Past them, one block in ``STRIDE`` is indexed, standing for the group it closes."""

_PACK_PAIR = struct.Struct("<QQ").pack


def seed_hash(target_model: str, cache_salt: str = "") -> int:
    """The chain's starting value: different models or salts never share a block hash."""
    return xxh64_intdigest(target_model.encode() + cache_salt.encode())


def block_hashes(tokens: bytes, block_bytes: int, seed: int, max_blocks: int | None) -> list[int]:
    """Chained hashes of ``tokens`` cut into ``block_bytes``-byte blocks, at most ``max_blocks``
    (``None`` = no cap).

    Two passes keep the loops tight (about 0.8 ms for 800 KB in 256-byte blocks): the content
    hashes in one comprehension over byte slices, then the chain over 16-byte packed pairs.
    """
    end = len(tokens)
    if max_blocks is not None:
        end = min(end, max_blocks * block_bytes)
    if end <= 0 or block_bytes <= 0:
        return []
    h = xxh64_intdigest
    contents = [h(tokens[i : i + block_bytes]) for i in range(0, end, block_bytes)]
    out: list[int] = []
    append = out.append
    prev = seed
    pack = _PACK_PAIR
    for content in contents:
        prev = h(pack(content, prev))
        append(prev)
    return out


class _Run:
    """Consecutive blocks of one endpoint's chains, touched together: ``blocks[0]`` sits at
    position ``base`` of every chain through it and follows the last block of ``parent``."""

    __slots__ = ("base", "blocks", "children", "parent")

    def __init__(self, blocks: list[int], base: int, parent: _Run | None) -> None:
        self.blocks = blocks
        self.base = base
        self.parent = parent
        # How many runs follow this one. A run is always touched after every run below it (a
        # new run is put in before the path above it is moved), so it leaves the LRU after
        # them: only a run with none is ever evicted, and a run with some is never extended.
        self.children = 0


class _Held:
    """One endpoint's blocks: which run holds each, and the runs least recently used first."""

    __slots__ = ("alone", "runs", "weight", "where")

    def __init__(self, endpoint: str) -> None:
        self.alone = (endpoint,)
        self.runs: OrderedDict[_Run, None] = OrderedDict()
        self.where: dict[int, _Run] = {}
        self.weight = 0  # the blocks its entries stand for


class PrefixIndex:
    """Which endpoints are believed to hold which prefix blocks; see the module docstring.

    Owners are stored as tuples: most blocks live on one endpoint, and a one-element tuple costs
    a fifth of a set. The tuples are shared (one per endpoint, one per combination).

    An endpoint's blocks are kept in runs, not one by one: a chain's blocks are touched together
    (last first), so its recency order is the runs' order, each read from its last block to its
    first. An agent's next turn then refreshes its known head by moving the few runs on its path
    and appends its new blocks to the run where the head ends, instead of moving thousands of
    blocks one at a time, on the routing worker and on every replica that applies its facts.
    This relies on the hashes being chained (``block_hashes``): a block held at position ``i``
    implies the chain's first ``i`` blocks, which lie on the runs above it. Input that breaks
    this (a block seen at two depths, repeats within a chain) keeps the index consistent and
    bounded, but may refresh or record less than the chain named.

    Past a chain's first ``dense`` blocks, one block in ``stride`` is indexed (the last of each
    group), an entry that stands for the ``stride`` blocks it closes: ``match`` then reports a
    long prefix to the last whole group it holds (at most ``stride - 1`` blocks short), and a
    195,000-token prompt costs the index 16 + 378 entries instead of 3,047. Capacities count
    blocks, so an endpoint still holds what its KV cache holds. ``stride=1`` indexes every block.
    """

    def __init__(
        self, default_capacity: int, dense: int = DENSE_BLOCKS, stride: int = STRIDE
    ) -> None:
        if default_capacity <= 0:
            raise ValueError(f"default_capacity must be > 0, got {default_capacity}")
        if dense < 0 or stride < 1:
            raise ValueError(f"need dense >= 0 and stride >= 1, got {dense} and {stride}")
        self.default_capacity = default_capacity
        self.dense, self.stride = dense, stride
        self._owners: dict[int, tuple[str, ...]] = {}
        self._held: dict[str, _Held] = {}
        self._capacity: dict[str, int] = {}
        self._size = 0  # blocks the entries stand for
        self._entries = 0
        # Owner tuples are shared: every block held by one endpoint points at that endpoint's
        # one-tuple (48 bytes saved per entry), and each combination of several owners is one
        # tuple. The few combinations that appear stay until the index is rebuilt.
        self._tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

    @property
    def size(self) -> int:
        """Number of (endpoint, block) pairs the index stands for (what capacities bound)."""
        return self._size

    @property
    def entries(self) -> int:
        """Number of (endpoint, block) entries stored."""
        return self._entries

    def approx_bytes(self) -> int:
        return self._entries * BYTES_PER_BLOCK

    def blocks(self, entries: int) -> int:
        """The blocks that a chain's first ``entries`` indexed entries stand for."""
        dense = self.dense
        return entries if entries <= dense else dense + (entries - dense) * self.stride

    def _entries_for(self, blocks: int) -> int:
        """How many of a chain's first entries stand for at most ``blocks`` blocks."""
        dense = self.dense
        return blocks if blocks <= dense else dense + (blocks - dense) // self.stride

    def reachable(self, blocks: int) -> int:
        """The most ``match`` reports for a chain of ``blocks`` blocks."""
        return self.blocks(self._entries_for(blocks))

    def indexed(self, chain: Sequence[int]) -> Sequence[int]:
        """The chain's blocks that are indexed: the dense head, then one per ``stride``."""
        dense, stride = self.dense, self.stride
        if stride == 1 or len(chain) <= dense:
            return chain
        return [*chain[:dense], *chain[dense + stride - 1 :: stride]]

    def table_bytes(self) -> tuple[int, int]:
        """Bytes of the hash tables: the owners map's, and the endpoints' own (each one's
        block-to-run map and run LRU). At the entry bound they still grow once, as the churn
        takes their free slots (``epp_tools.bench.scale.settle``), then keep their size. The
        runs' lists hold one slot per entry and are not counted."""
        own = sum(
            sys.getsizeof(held.where) + sys.getsizeof(held.runs) for held in self._held.values()
        )
        return sys.getsizeof(self._owners), own

    def __len__(self) -> int:
        """Number of distinct block hashes held by at least one endpoint."""
        return len(self._owners)

    def endpoints(self) -> list[str]:
        return list(self._held)

    def block_counts(self) -> dict[str, int]:
        """Endpoint → the blocks its entries stand for."""
        return {ep: held.weight for ep, held in self._held.items()}

    def recency(self, endpoint: str) -> list[int]:
        """The endpoint's indexed blocks, least recently used first: the order eviction takes
        them."""
        held = self._held.get(endpoint)
        if held is None:
            return []
        return [h for run in held.runs for h in reversed(run.blocks)]

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self.default_capacity)

    def owners(self, block_hash: int) -> tuple[str, ...]:
        return self._owners.get(block_hash, ())

    def add(self, endpoint: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        """Record that ``endpoint`` now holds ``hashes`` (a request's chain, in prompt order).

        ``capacity`` (blocks, > 0) sets the endpoint's LRU bound; ``None`` keeps the current one
        (the default for a new endpoint). The chain is touched last-block-first so the leading
        blocks end up most recently used: under pressure the tail goes first, and a tail block is
        worthless once its prefix is gone. A chain longer than the capacity keeps its head.
        """
        cap = self._set_capacity(endpoint, capacity)
        self.add_indexed(endpoint, self.indexed(hashes[:cap]), capacity)

    def _set_capacity(self, endpoint: str, capacity: int | None) -> int:
        if capacity is not None and capacity > 0:
            self._capacity[endpoint] = capacity
        return self._capacity.get(endpoint, self.default_capacity)

    def add_indexed(self, endpoint: str, entries: Sequence[int], capacity: int | None) -> None:
        """``add`` for a chain's indexed blocks only (``indexed``), as other replicas send them:
        the same index with the same stride."""
        held = self._held.get(endpoint)
        if held is None:
            held = self._held[endpoint] = _Held(endpoint)
        cap = self._set_capacity(endpoint, capacity)
        limit = self._entries_for(cap)
        chain = entries if len(entries) <= limit else entries[:limit]  # read, never kept
        known = _held_head(held.where, chain)
        head = self._cut(held, chain[known - 1], known) if known else None
        if head is None:
            known = 0  # nothing known, or not where a chain would hold it: all of it is new
        tail = chain[known:] if known else chain
        if tail:
            self._extend(held, head, tail, known)
        move = held.runs.move_to_end
        while head is not None:  # the path up to the chain's first block, which ends newest
            move(head)
            head = head.parent
        if held.weight > cap:
            self._evict(held, held.weight - cap)

    def _cut(self, held: _Held, last: int, known: int) -> _Run | None:
        """The run ending with ``last``, the chain's block ``known - 1``, split off the run
        holding it if blocks follow; ``None`` if it is held at another depth (not chained)."""
        run = held.where[last]
        blocks = run.blocks
        pos = known - 1 - run.base
        if not (0 <= pos < len(blocks) and blocks[pos] == last):
            return None
        if pos == len(blocks) - 1:
            return run
        # The head becomes a run of its own (it is about to be touched); the rest keeps the
        # run's place in the LRU, which an OrderedDict can only give the object already there.
        top = _Run(blocks[: pos + 1], run.base, run.parent)  # in the run's place below its parent
        del blocks[: pos + 1]
        run.base += pos + 1
        run.parent = top
        top.children = 1
        held.where.update(zip(top.blocks, repeat(top)))
        held.runs[top] = None
        return top

    def _extend(self, held: _Held, head: _Run | None, tail: Sequence[int], base: int) -> None:
        """Add the chain's new blocks, ``tail`` (chain positions from ``base``), below ``head``.

        Each map is written with one ``setdefault`` pass (C-level), whose answers tell whether a
        block was already there: for chained input none was, and the pass did all the work.
        """
        # the chain goes on where its known head ends (an agent's next turn), or branches off
        run = head if head is not None and not head.children else _Run([], base, head)
        where = held.where
        before = len(where)
        prior = list(map(where.setdefault, tail, repeat(run)))
        if len(where) - before != len(tail):  # not chained: add only the blocks that are new
            had = set(run.blocks)
            fresh = (h for h, was in zip(tail, prior, strict=True) if was is run and h not in had)
            tail = list(dict.fromkeys(fresh))
            if not tail:
                return
        if run is not head:
            if head is not None:
                head.children += 1
            held.runs[run] = None
        start = run.base + len(run.blocks)  # the chain position of the first new entry
        weight = self.blocks(start + len(tail)) - self.blocks(start)
        run.blocks += tail
        held.weight += weight
        self._size += weight
        self._entries += len(tail)
        alone = held.alone
        owners_before = list(map(self._owners.setdefault, tail, repeat(alone)))
        if owners_before.count(alone) == len(tail):  # the usual case: nobody else holds them
            return
        for h, owners in zip(tail, owners_before, strict=True):
            if owners is not alone:
                self._owners[h] = self._joined(owners, alone[0])

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Endpoint → number of leading blocks of ``hashes`` it holds consecutively.

        Stops at the first block nobody holds (or once every endpoint has dropped out), so the
        cost follows the match length, not the prompt length. Endpoints with no leading block
        are absent. Past the dense head, a count is a multiple of the stride (see the class).
        """
        owners = self._owners
        result: dict[str, int] = {}
        alive: set[str] = set()
        previous: tuple[str, ...] = ()
        depth = 0
        for h in self.indexed(hashes):
            held = owners.get(h)
            if held is None:
                break
            # Consecutive blocks of one prompt usually have the same owners: one tuple
            # comparison then replaces the set work.
            if held != previous:
                if depth == 0:
                    alive.update(held)
                else:
                    dropped = alive.difference(held)
                    if dropped:
                        for ep in dropped:
                            result[ep] = depth
                        alive -= dropped
                        if not alive:
                            break
                previous = held
            depth += 1
        for ep in alive:
            result[ep] = depth
        if depth > self.dense:  # entries past the dense head stand for ``stride`` blocks each
            return {ep: self.blocks(n) for ep, n in result.items()}
        return result

    def remove_endpoint(self, endpoint: str) -> None:
        held = self._held.pop(endpoint, None)
        self._capacity.pop(endpoint, None)
        if held is None:
            return
        for h in held.where:
            self._drop_owner(h, endpoint)
        self._size -= held.weight
        self._entries -= len(held.where)
        for key in [k for k in self._tuples if endpoint in k]:
            del self._tuples[key]

    def retain(self, live: Collection[str]) -> list[str]:
        """Drop every endpoint not in ``live``; returns the dropped ids."""
        gone = [ep for ep in self._held if ep not in live]
        for ep in gone:
            self.remove_endpoint(ep)
        return gone

    def _evict(self, held: _Held, excess: int) -> None:
        """Drop the endpoint's least recently used entries until ``excess`` blocks are gone: the
        last entries of its least recently used run (a leaf: a run is touched after every run
        below it), then the next run's."""
        runs = held.runs
        while excess > 0:
            run = next(iter(runs))
            blocks = run.blocks
            end = run.base + len(blocks)
            keep = max(run.base, self._entries_for(self.blocks(end) - excess))
            weight = self.blocks(end) - self.blocks(keep)
            if keep == run.base:
                del runs[run]
                if run.parent is not None:
                    run.parent.children -= 1
                gone = blocks
            else:
                gone = blocks[keep - run.base :]
                del blocks[keep - run.base :]
            excess -= weight
            held.weight -= weight
            self._size -= weight
            self._entries -= len(gone)
            self._forget(held, gone)

    def _forget(self, held: _Held, gone: list[int]) -> None:
        """Remove evicted blocks from the endpoint's map and from their owners (C-level passes
        when, as usual, nobody else holds them)."""
        deque(map(held.where.__delitem__, gone), 0)
        alone = held.alone
        owners_before = list(map(self._owners.pop, gone))
        if owners_before.count(alone) == len(gone):
            return
        for h, prior in zip(gone, owners_before, strict=True):
            if prior is not alone:
                self._owners[h] = prior
                self._drop_owner(h, alone[0])

    def _joined(self, held: tuple[str, ...], endpoint: str) -> tuple[str, ...]:
        """``held`` plus ``endpoint``, one shared tuple per combination."""
        key = (*held, endpoint)
        return self._tuples.setdefault(key, key)

    def _drop_owner(self, h: int, endpoint: str) -> None:
        held = self._owners.get(h)
        if held is None:
            return
        rest = tuple(ep for ep in held if ep != endpoint)
        if len(rest) == 1:
            other = self._held.get(rest[0])
            self._owners[h] = other.alone if other is not None else rest
        elif rest:
            self._owners[h] = self._tuples.setdefault(rest, rest)
        else:
            del self._owners[h]


def _held_head(where: Mapping[int, object], chain: Sequence[int]) -> int:
    """How many leading blocks of ``chain`` the endpoint holds, found by bisection (a dozen
    lookups for a 3,000-block chain): an endpoint holds a chain's blocks as a prefix, since
    eviction takes a run's last blocks first and a run is evicted after every run below it."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in where:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PendingBlocks:
    """The chains learned since the last ``drain``, per endpoint, for other replicas.

    ``drain`` gives one fact per chain, each endpoint's oldest chain first, so applying them in
    order with ``PrefixIndex.add`` leaves the receiving index with the same recency order as
    here. A chain that a later chain of the same endpoint contains (its last block is there:
    chained hashes) is left out, since applying the later one touches it too. At most
    ``max_blocks`` pairs are drained: past it the oldest chains of the endpoint touched longest
    ago are dropped first, a chain's tail before its head, and ``on_drop`` is told how many.

    ``add`` only keeps the chain (it runs on the request path, once per routed request); the
    chains are compared when drained, or sooner once the kept pairs, repeats counted, pass twice
    the bound, so memory stays bounded.
    """

    def __init__(self, max_blocks: int, on_drop: Callable[[int], object] | None = None) -> None:
        self.max_blocks = max_blocks
        self._on_drop = on_drop
        # endpoint -> its chains as added, oldest first; endpoints ordered by their last touch
        self._chains: OrderedDict[str, list[list[int]]] = OrderedDict()
        self._capacity: dict[str, int] = {}
        self._kept = 0  # pairs held in ``_chains``, repeats counted until settled

    def __len__(self) -> int:
        """Pairs that would be drained now (settles what was added)."""
        self._settle()
        return self._kept

    def add(self, endpoint: str, hashes: Sequence[int], capacity: int) -> None:
        """Record a chain as ``PrefixIndex.add`` does."""
        # a copy: the caller's list may change after it returns
        chain = hashes[:capacity] if isinstance(hashes, list) else list(hashes[:capacity])
        if not chain:
            return
        chains = self._chains.get(endpoint)
        if chains is None:
            chains = self._chains[endpoint] = []
        else:
            self._chains.move_to_end(endpoint)
        self._capacity[endpoint] = capacity
        chains.append(chain)
        self._kept += len(chain)
        if self._kept > 2 * self.max_blocks:
            self._settle()

    def _settle(self) -> None:
        """Leave out the chains a later one contains, then drop past the bound."""
        kept = 0
        for chains in self._chains.values():
            if len(chains) > 1:
                chains[:] = _uncovered(chains)
            kept += sum(map(len, chains))
        excess = max(0, kept - self.max_blocks)
        self._kept = kept - excess
        left = excess
        while left:
            endpoint, chains = next(iter(self._chains.items()))
            oldest = chains[0]
            if len(oldest) <= left:
                left -= len(oldest)
                del chains[0]
                if not chains:
                    del self._chains[endpoint]
                continue
            chains[0] = oldest[: len(oldest) - left]
            left = 0
        if excess and self._on_drop is not None:
            self._on_drop(excess)

    def drain(self) -> list[list[Any]]:
        """One fact per chain, ``[endpoint id, capacity, [block hashes, in prompt order]]``, the
        endpoint touched last first and each endpoint's chains oldest first; empties the
        buffer."""
        self._settle()
        facts: list[list[Any]] = [
            [ep, self._capacity[ep], chain]
            for ep, chains in reversed(self._chains.items())
            for chain in chains
        ]
        self._chains.clear()
        self._capacity.clear()
        self._kept = 0
        return facts


def _uncovered(chains: list[list[int]]) -> list[list[int]]:
    """``chains`` (oldest first) without those a later chain contains: a chained block implies
    its whole prefix, so a chain whose last block a later chain holds is that chain's prefix."""
    later: set[int] = set()
    out: list[list[int]] = []
    for chain in reversed(chains):
        if chain[-1] in later:
            continue
        later.update(chain)
        out.append(chain)
    out.reverse()
    return out
