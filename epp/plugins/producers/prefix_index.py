"""Prefix block hashing and the approximate prefix index (pure, synchronous, bounded).

Hashing (spec §4.8). A prompt's token ids, packed as little-endian ``uint32`` bytes, are cut into
blocks of ``block_size`` tokens (the last block may be partial)::

    seed      = xxh64(target_model bytes ‖ cache_salt bytes)
    content_i = xxh64(block_i bytes)
    hash_i    = xxh64(LE64(content_i) ‖ LE64(hash_{i-1}))      with hash_{-1} = seed

so a block's hash identifies the whole prefix up to and including it: two prompts that differ in
their first block share no hash at all, and different models or cache salts never collide.

Index. ``hash → endpoints holding it`` plus one LRU of hashes per endpoint, bounded by that
endpoint's capacity (in blocks). Evicting a hash from an endpoint's LRU removes the endpoint from
the hash's owners, so memory is at most ``sum(capacities)`` entries (``approx_bytes`` estimates
it); endpoints that left the pool are dropped with ``retain``. ``match`` costs O(matched blocks):
it walks the request's hashes in order and stops at the first block no endpoint holds.

Sharing. ``PendingBlocks`` buffers what the index learned since the last export, folded per
endpoint in recency order, for the replicas that apply it (``epp.plugin.sharing``).
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Sequence
from itertools import chain as chain_all
from typing import Any, Final

from xxhash import xxh64_intdigest

BYTES_PER_BLOCK: Final = 195
"""Estimated memory of one (endpoint, block) entry. Measured with ``tracemalloc`` on CPython 3.11
(64-bit hashes, the hash ints counted): about 194 bytes for a block held by one endpoint (LRU
node, owners-map slot, hash int; the owner tuple is shared) and about 105 for each further
endpoint holding it. Before the owner tuples were shared it was 242."""

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


class PrefixIndex:
    """Which endpoints are believed to hold which prefix blocks; see the module docstring.

    Owners are stored as tuples: most blocks live on one endpoint, and a one-element tuple costs
    a fifth of a set. The tuples are shared (one per endpoint, one per combination), and ``add``
    evicts once per chain, not once per block: at capacity every new block evicts one, so this is
    the index's cost on a busy pool and on every replica that applies another's facts.
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity <= 0:
            raise ValueError(f"default_capacity must be > 0, got {default_capacity}")
        self.default_capacity = default_capacity
        self._owners: dict[int, tuple[str, ...]] = {}
        self._lrus: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._size = 0
        # Owner tuples are shared: every block held by one endpoint points at that endpoint's
        # one-tuple (48 bytes saved per entry), and each combination of several owners is one
        # tuple. The few combinations that appear stay until the index is rebuilt.
        self._alone: dict[str, tuple[str]] = {}
        self._tuples: dict[tuple[str, ...], tuple[str, ...]] = {}

    @property
    def size(self) -> int:
        """Number of (endpoint, block) entries."""
        return self._size

    def approx_bytes(self) -> int:
        return self._size * BYTES_PER_BLOCK

    def table_bytes(self) -> tuple[int, int]:
        """Bytes of the owners map's hash table and of the endpoints' LRUs (tables and nodes):
        at the entry bound they still grow once, as the churn takes their free slots
        (``epp_tools.bench.scale.settle``), then keep their size."""
        return sys.getsizeof(self._owners), sum(sys.getsizeof(lru) for lru in self._lrus.values())

    def __len__(self) -> int:
        """Number of distinct block hashes held by at least one endpoint."""
        return len(self._owners)

    def endpoints(self) -> list[str]:
        return list(self._lrus)

    def block_counts(self) -> dict[str, int]:
        return {ep: len(lru) for ep, lru in self._lrus.items()}

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
        lru = self._lrus.get(endpoint)
        if lru is None:
            lru = self._lrus[endpoint] = OrderedDict()
        if capacity is not None and capacity > 0:
            self._capacity[endpoint] = capacity
        cap = self._capacity.get(endpoint, self.default_capacity)
        alone = self._alone.get(endpoint)
        if alone is None:
            alone = self._alone[endpoint] = (endpoint,)
        chain = hashes[:cap]
        known = _held_head(lru, chain)
        # slices only where the chain splits: a fresh prompt and a whole hit are not copied again
        added = self._touch(endpoint, lru, alone, chain[known:] if known else chain)
        if known:
            head = chain if known == len(chain) else chain[:known]
            try:  # an agent's next turn: thousands of known blocks, moved in one C-level pass
                deque(map(lru.move_to_end, reversed(head)), 0)
            except KeyError:  # a block of the head was not there after all: block by block
                added += self._touch(endpoint, lru, alone, head)
        self._size += added
        if len(lru) > cap:
            # Evicting once the chain is in leaves the same blocks as evicting one per insert:
            # the chain (at most ``cap`` blocks) is at the recent end either way.
            self._evict(endpoint, lru, len(lru) - cap)

    def _touch(
        self, endpoint: str, lru: OrderedDict[int, None], alone: tuple[str], blocks: Sequence[int]
    ) -> int:
        """Touch ``blocks`` last first, adding those the endpoint lacks; returns how many."""
        owners = self._owners
        added = 0
        for h in reversed(blocks):
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            held = owners.get(h)
            owners[h] = alone if held is None else self._joined(held, endpoint)
            added += 1
        return added

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Endpoint → number of leading blocks of ``hashes`` it holds consecutively.

        Stops at the first block nobody holds (or once every endpoint has dropped out), so the
        cost follows the match length, not the prompt length. Endpoints with no leading block
        are absent.
        """
        owners = self._owners
        result: dict[str, int] = {}
        alive: set[str] = set()
        previous: tuple[str, ...] = ()
        depth = 0
        for h in hashes:
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
        return result

    def remove_endpoint(self, endpoint: str) -> None:
        lru = self._lrus.pop(endpoint, None)
        self._capacity.pop(endpoint, None)
        if lru is None:
            return
        for h in lru:
            self._drop_owner(h, endpoint)
        self._size -= len(lru)
        self._alone.pop(endpoint, None)
        for key in [k for k in self._tuples if endpoint in k]:
            del self._tuples[key]

    def retain(self, live: Collection[str]) -> list[str]:
        """Drop every endpoint not in ``live``; returns the dropped ids."""
        gone = [ep for ep in self._lrus if ep not in live]
        for ep in gone:
            self.remove_endpoint(ep)
        return gone

    def _evict(self, endpoint: str, lru: OrderedDict[int, None], count: int) -> None:
        """Drop the ``count`` least recently used blocks of ``endpoint``."""
        owners = self._owners
        alone = self._alone.get(endpoint)
        pop = lru.popitem
        for _ in range(count):
            h, _ = pop(last=False)
            held = owners[h]
            if held is alone:  # the common case: nobody else holds it
                del owners[h]
            else:
                self._drop_owner(h, endpoint)
        self._size -= count

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
            self._owners[h] = self._alone.get(rest[0]) or rest
        elif rest:
            self._owners[h] = self._tuples.setdefault(rest, rest)
        else:
            del self._owners[h]


def _held_head(lru: OrderedDict[int, None], chain: Sequence[int]) -> int:
    """How many leading blocks of ``chain`` the LRU holds, found by bisection (a dozen lookups
    for a 3,000-block chain). An index holds a chain's blocks as a prefix (the tail is evicted
    first); where it does not, ``add`` finds the hole and falls back to its block-by-block loop."""
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if chain[mid - 1] in lru:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PendingBlocks:
    """The (endpoint, block) pairs learned since the last ``drain``, for other replicas.

    ``drain`` gives them per endpoint in the order the index touched them, with duplicates folded
    (a block sent twice to one endpoint is one pair, at its latest position), so one
    ``PrefixIndex.add`` per endpoint on the receiving side leaves the same recency order as here.
    At most ``max_blocks`` pairs are drained: past it the oldest pairs of the endpoint touched
    longest ago are dropped first, and ``on_drop`` is told how many.

    ``add`` only keeps the chain: it runs on the request path, once per routed request, and
    folding a 3,000-block chain block by block cost about 0.3 ms there. The chains of an
    endpoint are folded together by ``dict.fromkeys`` (one C-level pass) when drained, or sooner
    once the kept pairs, repeats counted, pass twice the bound, so memory stays bounded and a
    pair is folded O(1) times. A lone chain is drained as it came: its hashes are chained, so
    they are distinct (a repeat would only refresh the block on the receiving side).
    """

    def __init__(self, max_blocks: int, on_drop: Callable[[int], object] | None = None) -> None:
        self.max_blocks = max_blocks
        self._on_drop = on_drop
        # endpoint -> its chains as added (each newest block first), oldest chain first;
        # endpoints ordered by their last touch
        self._chains: OrderedDict[str, list[Sequence[int]]] = OrderedDict()
        self._capacity: dict[str, int] = {}
        self._kept = 0  # pairs held in ``_chains``, repeats counted until folded

    def __len__(self) -> int:
        """Pairs that would be drained now (folds what was added)."""
        self._settle()
        return self._kept

    def add(self, endpoint: str, hashes: Sequence[int], capacity: int) -> None:
        """Record a chain as ``PrefixIndex.add`` does (last block first: the head is newest)."""
        chains = self._chains.get(endpoint)
        if chains is None:
            chains = self._chains[endpoint] = []
        else:
            self._chains.move_to_end(endpoint)
        self._capacity[endpoint] = capacity
        chain = hashes[:capacity]  # a copy: the caller's list may change after it returns
        chains.append(chain)
        self._kept += len(chain)
        if self._kept > 2 * self.max_blocks:
            self._settle()

    def _settle(self) -> None:
        """Fold every endpoint's chains into one, then drop past the bound."""
        kept = 0
        for chains in self._chains.values():
            if len(chains) > 1 or not isinstance(chains[0], list):
                chains[:] = (list(dict.fromkeys(chain_all.from_iterable(reversed(chains)))),)
            kept += len(chains[0])
        excess = max(0, kept - self.max_blocks)
        self._kept = kept - excess
        left = excess
        while left:
            endpoint, chains = next(iter(self._chains.items()))
            oldest = chains[0]  # folded: the endpoint's one chain
            if len(oldest) <= left:
                left -= len(oldest)
                del self._chains[endpoint]
                continue
            chains[0] = oldest[: len(oldest) - left]
            left = 0
        if excess and self._on_drop is not None:
            self._on_drop(excess)

    def drain(self) -> list[list[Any]]:
        """One fact per endpoint, ``[endpoint id, capacity, [block hashes, newest first]]``, the
        endpoint touched last first; empties the buffer."""
        self._settle()
        facts: list[list[Any]] = [
            [ep, self._capacity[ep], chains[0]] for ep, chains in reversed(self._chains.items())
        ]
        self._chains.clear()
        self._capacity.clear()
        self._kept = 0
        return facts
