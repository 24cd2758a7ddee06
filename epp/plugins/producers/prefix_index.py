"""Prefix block hashing and the approximate prefix index (pure, synchronous, bounded).

Hashing (spec §4.8). A prompt's token ids, packed as little-endian ``uint32`` bytes, are cut into
blocks of ``block_size`` tokens (the last block may be partial)::

    seed      = xxh64(target_model bytes ‖ cache_salt bytes)
    content_i = xxh64(block_i bytes)
    hash_i    = xxh64(LE64(content_i) ‖ LE64(hash_{i-1}))      with hash_{-1} = seed

so a block's hash identifies the whole prefix up to and including it: two prompts that differ in
their first block share no hash at all, and different models or cache salts never collide.

Index. Per endpoint, an LRU of its blocks bounded by that endpoint's capacity (in blocks), kept
as runs of consecutive blocks of one chain (a turn costs its new blocks and the runs on its path,
not its length), and one map ``hash → the run holding it`` (one run per endpoint for a block
several hold), which tells both the block's endpoints and where each keeps it. Evicting a block
from an endpoint's LRU takes its run out of the map, so memory is at most ``sum(capacities)``
entries (``approx_bytes`` estimates it); endpoints that left the pool are dropped with ``retain``.
``match`` costs O(matched blocks): it walks the request's hashes in order and stops at the first
block no endpoint holds.

Sharing. ``PendingBlocks`` buffers the chains the index learned since the last export, per
endpoint in the order they came, for the replicas that apply them (``epp.plugin.sharing``).
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import repeat
from typing import Any, Final

from xxhash import xxh64_intdigest

BYTES_PER_BLOCK: Final = 100
"""Estimated memory of one (endpoint, block) entry. Measured with ``tracemalloc`` on CPython 3.11
(64-bit hashes, the hash ints counted): about 97 bytes for a block held by one endpoint (its slot
in the block map and in its run's list, and the hash int), plus a tuple of runs for a block
several endpoints hold. With a block-to-run map per endpoint beside an owners map it was 149,
with one ordered-dict LRU per endpoint 195."""

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
    end = _hashed_end(tokens, block_bytes, max_blocks)
    return _chain(tokens, 0, end, block_bytes, seed, []) if end > 0 else []


def _hashed_end(tokens: bytes, block_bytes: int, max_blocks: int | None) -> int:
    """Where hashing stops: the end of ``tokens`` or of its last block under the cap."""
    if block_bytes <= 0:
        return 0
    end = len(tokens)
    return end if max_blocks is None else min(end, max_blocks * block_bytes)


def _chain(
    tokens: bytes, start: int, end: int, block_bytes: int, prev: int, out: list[int]
) -> list[int]:
    """``out`` extended by the chained hashes of the blocks from ``start`` (a block boundary) to
    ``end``, the chain going on from ``prev``."""
    h = xxh64_intdigest
    contents = [h(tokens[i : i + block_bytes]) for i in range(start, end, block_bytes)]
    append = out.append
    pack = _PACK_PAIR
    for content in contents:
        prev = h(pack(content, prev))
        append(prev)
    return out


class _CachedChain:
    """A prompt hashed recently: its whole blocks (a view, no copy) and their hashes."""

    __slots__ = ("block_bytes", "blocks", "hashes", "seed", "size")

    def __init__(self, seed: int, block_bytes: int, tokens: bytes, hashes: list[int]) -> None:
        self.seed = seed
        self.block_bytes = block_bytes
        whole = min(len(tokens) // block_bytes, len(hashes))
        self.size = whole * block_bytes
        self.blocks = memoryview(tokens)[: self.size]
        self.hashes = hashes


class ChainCache:
    """The last prompts hashed, so that a prompt extending one of them hashes only what follows.

    An agent's next turn sends its whole conversation again with the last answer and a tool
    result appended: its first blocks are the previous turn's, and hashing them again was the
    largest cost of routing it (about 2.3 ns per token, 0.4 ms for a 195,000-token context).
    ``hashes`` looks for the longest cached prompt whose whole blocks begin the new one (one
    ``memcmp`` per cached prompt, stopping at the first differing byte), takes their hashes, and
    hashes the rest; the chain is the one ``block_hashes`` gives, since each hash covers the
    whole prefix up to its block. The new prompt then takes the place of the one it extended.

    Only prompts of at least ``min_blocks`` blocks are looked up and kept: below that, hashing
    costs about what looking through the cache would (each ``memcmp`` runs through the system
    prompt that sessions share), so short prompts are hashed as before. Bounded: at most
    ``max_entries`` prompts and ``max_bytes`` of their bytes (views of the requests' own token
    bytes, the oldest dropped first; a prompt larger than the budget is hashed and not kept), a
    fixed amount however many requests are in flight. Lists returned are shared with the cache:
    read them, never change them.
    """

    __slots__ = ("_entries", "_held", "hits", "max_bytes", "max_entries", "min_blocks", "misses")

    def __init__(
        self, max_bytes: int = 8 << 20, max_entries: int = 32, min_blocks: int = 128
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.min_blocks = min_blocks
        self._entries: list[_CachedChain] = []  # oldest first
        self._held = 0  # bytes viewed by the entries
        self.hits = 0  # prompts that extended a cached one
        self.misses = 0

    def hashes(
        self, tokens: bytes, block_bytes: int, seed: int, max_blocks: int | None
    ) -> list[int]:
        """``block_hashes(tokens, block_bytes, seed, max_blocks)``, from the cache where it can."""
        end = _hashed_end(tokens, block_bytes, max_blocks)
        if end <= 0:
            return []
        if end < self.min_blocks * block_bytes or type(tokens) is not bytes:
            # short, or a mutable buffer (a view of it could change under the cache)
            return _chain(tokens, 0, end, block_bytes, seed, [])
        found = self._longest(tokens, block_bytes, seed, end)
        if found is None:
            self.misses += 1
            out = _chain(tokens, 0, end, block_bytes, seed, [])
        else:
            self.hits += 1
            old = self._entries.pop(found)
            self._held -= old.size
            whole = old.size // block_bytes
            out = old.hashes[:whole]
            _chain(tokens, old.size, end, block_bytes, out[-1], out)
        self._keep(_CachedChain(seed, block_bytes, tokens, out))
        return out

    def _longest(self, tokens: bytes, block_bytes: int, seed: int, end: int) -> int | None:
        best, best_size = None, 0
        for i, entry in enumerate(self._entries):
            size = entry.size
            if (
                best_size < size <= end
                and entry.seed == seed
                and entry.block_bytes == block_bytes
                and tokens.startswith(entry.blocks)
            ):
                best, best_size = i, size
        return best

    def _keep(self, entry: _CachedChain) -> None:
        if entry.size == 0 or entry.size > self.max_bytes:
            return
        entries = self._entries
        entries.append(entry)
        self._held += entry.size
        while len(entries) > self.max_entries or self._held > self.max_bytes:
            self._held -= entries.pop(0).size

    def clear(self) -> None:
        self._entries.clear()
        self._held = 0

    @property
    def held_bytes(self) -> int:
        """Bytes of the cached prompts (views of the requests' token bytes)."""
        return self._held

    def __len__(self) -> int:
        return len(self._entries)


class _Run:
    """Consecutive blocks of one endpoint's chains, touched together: ``blocks[0]`` sits at
    position ``base`` of every chain through it and follows the last block of ``parent``."""

    __slots__ = ("base", "blocks", "children", "owner", "parent")

    def __init__(self, blocks: list[int], base: int, parent: _Run | None, owner: _Held) -> None:
        self.blocks = blocks
        self.base = base
        self.parent = parent
        self.owner = owner
        # How many runs follow this one. A run is always touched after every run below it (a
        # new run is put in before the path above it is moved), so it leaves the LRU after
        # them: only a run with none is ever evicted, and a run with some is never extended.
        self.children = 0


class _Held:
    """One endpoint's blocks: its runs, least recently used first."""

    __slots__ = ("alone", "runs", "weight")

    def __init__(self, endpoint: str) -> None:
        self.alone: tuple[str, ...] = (endpoint,)  # the owners of a block only this endpoint holds
        self.runs: OrderedDict[_Run, None] = OrderedDict()
        self.weight = 0  # the blocks its entries stand for


_Where = _Run | tuple[_Run, ...]
"""What the index keeps per block: the run holding it, or one run per endpoint holding it."""


def _run_of(where: _Where, held: _Held) -> _Run | None:
    """The run of ``held``'s endpoint among the block's, if it holds the block."""
    if isinstance(where, _Run):
        return where if where.owner is held else None
    for run in where:
        if run.owner is held:
            return run
    return None


class PrefixIndex:
    """Which endpoints are believed to hold which prefix blocks; see the module docstring.

    One map serves matching and each endpoint's bookkeeping: a block maps to the run holding it
    (its endpoint is the run's owner), or, for the few blocks several endpoints hold, to a tuple
    of their runs. A new block then costs one map write, an evicted one one removal.

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
        self._at: dict[int, _Where] = {}
        self._held: dict[str, _Held] = {}
        self._capacity: dict[str, int] = {}
        self._size = 0  # blocks the entries stand for
        self._entries = 0

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
        """Bytes of the hash tables: the block map's, and the endpoints' run LRUs. At the entry
        bound the block map still grows once, as the churn takes its free slots
        (``epp_tools.bench.scale.settle``), then keeps its size. The runs' lists hold one slot
        per entry and are not counted."""
        own = sum(sys.getsizeof(held.runs) for held in self._held.values())
        return sys.getsizeof(self._at), own

    def __len__(self) -> int:
        """Number of distinct block hashes held by at least one endpoint."""
        return len(self._at)

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
        where = self._at.get(block_hash)
        if where is None:
            return ()
        if isinstance(where, _Run):
            return where.owner.alone
        return tuple(run.owner.alone[0] for run in where)

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
        known = _held_head(self._at, held, chain)
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
        run = _run_of(self._at[last], held)
        if run is None:
            return None
        blocks = run.blocks
        pos = known - 1 - run.base
        if not (0 <= pos < len(blocks) and blocks[pos] == last):
            return None
        if pos == len(blocks) - 1:
            return run
        # The head becomes a run of its own (it is about to be touched); the rest keeps the
        # run's place in the LRU, which an OrderedDict can only give the object already there.
        top = _Run(blocks[: pos + 1], run.base, run.parent, held)  # in the run's place
        del blocks[: pos + 1]
        run.base += pos + 1
        run.parent = top
        top.children = 1
        self._rename(run, top, top.blocks)
        held.runs[top] = None
        return top

    def _rename(self, run: _Run, top: _Run, blocks: list[int]) -> None:
        """``blocks``, held by ``run``, are now ``top``'s (a C-level pass when, as usual, no
        other endpoint holds them)."""
        at = self._at
        prior = list(map(at.__getitem__, blocks))
        if prior.count(run) == len(blocks):
            at.update(zip(blocks, repeat(top)))
            return
        for h, where in zip(blocks, prior, strict=True):
            at[h] = top if where is run else tuple(top if r is run else r for r in where)  # type: ignore[union-attr]

    def _extend(self, held: _Held, head: _Run | None, tail: Sequence[int], base: int) -> None:
        """Add the chain's new blocks, ``tail`` (chain positions from ``base``), below ``head``.

        The block map is written with one ``setdefault`` pass (C-level), whose answers tell
        whether a block was already there: for chained input that no other endpoint holds none
        was, and the pass did all the work.
        """
        # the chain goes on where its known head ends (an agent's next turn), or branches off
        run = head if head is not None and not head.children else _Run([], base, head, held)
        at = self._at
        before = len(at)
        prior = list(map(at.setdefault, tail, repeat(run)))
        if len(at) - before != len(tail):  # held elsewhere too, or not chained
            tail = self._join(held, run, tail, prior)
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

    def _join(self, held: _Held, run: _Run, tail: Sequence[int], prior: list[_Where]) -> list[int]:
        """The blocks of ``tail`` new to ``held``'s endpoint, each once, in order: those the
        ``setdefault`` pass put in (``prior`` is ``run``), and those other endpoints hold, which
        ``run`` now holds too. Those this endpoint holds already (not chained) are left out."""
        had = set(run.blocks)
        fresh: dict[int, None] = {}
        at = self._at
        for h, where in zip(tail, prior, strict=True):
            if h in fresh or h in had:
                continue
            if where is not run:
                if _run_of(where, held) is not None:
                    continue
                at[h] = (*((where,) if isinstance(where, _Run) else where), run)
            fresh[h] = None
        return list(fresh)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Endpoint → number of leading blocks of ``hashes`` it holds consecutively.

        Stops at the first block nobody holds (or once every endpoint has dropped out), so the
        cost follows the match length, not the prompt length. Endpoints with no leading block
        are absent. Past the dense head, a count is a multiple of the stride (see the class).
        """
        at = self._at
        result: dict[str, int] = {}
        alive: set[str] = set()
        previous: tuple[str, ...] = ()
        last: _Where | None = None
        depth = 0
        for h in self.indexed(hashes):
            where = at.get(h)
            if where is None:
                break
            # Consecutive blocks of one prompt usually lie on one run, then on runs of the same
            # endpoints: one identity test, else one tuple comparison, replaces the set work.
            if where is last:
                depth += 1
                continue
            last = where
            held: tuple[str, ...]
            if type(where) is _Run:
                held = where.owner.alone
            else:
                held = tuple(run.owner.alone[0] for run in where)  # type: ignore[union-attr]
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
        for run in held.runs:
            self._forget(run, run.blocks)
            self._entries -= len(run.blocks)
        self._size -= held.weight

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
            self._forget(run, gone)

    def _forget(self, run: _Run, gone: list[int]) -> None:
        """Take ``run``'s blocks ``gone`` out of the block map (one C-level pass when, as usual,
        no other endpoint holds them)."""
        at = self._at
        prior = list(map(at.pop, gone))
        if prior.count(run) == len(gone):
            return
        for h, where in zip(gone, prior, strict=True):
            if where is not run:  # several endpoints held it: the others still do
                rest = tuple(r for r in where if r is not run)  # type: ignore[union-attr]
                at[h] = rest[0] if len(rest) == 1 else rest


def _held_head(at: Mapping[int, _Where], held: _Held, chain: Sequence[int]) -> int:
    """How many leading blocks of ``chain`` the endpoint holds, found by bisection (a dozen
    lookups for a 3,000-block chain): an endpoint holds a chain's blocks as a prefix, since
    eviction takes a run's last blocks first and a run is evicted after every run below it."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        where = at.get(chain[mid - 1])
        if where is not None and _run_of(where, held) is not None:
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
