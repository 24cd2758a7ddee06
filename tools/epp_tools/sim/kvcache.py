"""KV-cache block pool with prefix caching, as vLLM's v1 block pool behaves.

The pool has ``num_blocks`` blocks of ``block_size`` tokens. A block is in one of three states:

* free: never filled, or released without a hash;
* cached and referenced: a full block whose chained hash is known and that at least one running
  request uses (``ref > 0``);
* cached and evictable: a full block with ``ref == 0``; it still serves prefix hits but is the
  first to be reused, least recently released first.

Block hashes chain like vLLM's: ``hash(parent_hash, token_ids, lora)`` where the first block's
parent is a fixed seed, so equal hashes mean equal prefixes. SHA-256 is used (vLLM's
``prefix_caching_hash_algo="sha256"``); the first 8 bytes, big-endian, make the 64-bit id that
KV events carry.

Usage (what ``vllm:kv_cache_usage_perc`` reports) counts only referenced blocks: cached blocks
nobody uses are free memory that happens to still hold data.

Every change that a KV-event subscriber must learn is appended to ``events`` (consecutive stores
of one chain merge into one ``BlockStored``), and the owner drains them; an owner with no
subscriber sets ``record_events`` to False and no event is built.

Memory: a cached block costs a dict entry and a small object (about 150 bytes), one more ordered
dict entry while it is evictable; token ids come as ``array('I')`` slices (``engine.compact_ids``)
and are hashed straight from their bytes.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

_ROOT_SEED = b"epp-sim-root"
_LITTLE_ENDIAN = sys.byteorder == "little"


def _le_bytes(token_ids: Sequence[int]) -> bytes:
    """The ids as little-endian uint32 bytes (an ``array('I')`` on a little-endian machine
    already is)."""
    if _LITTLE_ENDIAN and isinstance(token_ids, array) and token_ids.itemsize == 4:
        return token_ids.tobytes()
    return struct.pack(f"<{len(token_ids)}I", *(t & 0xFFFFFFFF for t in token_ids))


def hash_block(parent: int | None, token_ids: Sequence[int], lora_name: str | None) -> int:
    h = hashlib.sha256()
    h.update(_ROOT_SEED if parent is None else parent.to_bytes(8, "big"))
    h.update(_le_bytes(token_ids))
    if lora_name:
        h.update(lora_name.encode())
    return int.from_bytes(h.digest()[:8], "big")


def chain_hashes(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None,
    known: list[int] | None = None,
) -> list[int]:
    """Chained hashes of every full block of ``token_ids``; extends ``known`` in place if given."""
    hashes = known if known is not None else []
    full = len(token_ids) // block_size
    for i in range(len(hashes), full):
        parent = hashes[i - 1] if i else None
        hashes.append(
            hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], lora_name)
        )
    return hashes


@dataclass
class BlockStored:
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    lora_name: str | None
    medium: str = "GPU"


@dataclass
class BlockRemoved:
    block_hashes: list[int]
    medium: str = "GPU"


@dataclass
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class _Cached:
    ref: int = 0


@dataclass
class BlockPool:
    num_blocks: int
    block_size: int
    free_uncached: int = -1
    evictions: int = 0
    events: list[KVEvent] = field(default_factory=list)
    record_events: bool = True
    _cached: dict[int, _Cached] = field(default_factory=dict)
    # ref == 0 cached blocks; first item = least recently released = next to evict
    _evictable: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.free_uncached < 0:
            self.free_uncached = self.num_blocks

    @property
    def used_blocks(self) -> int:
        return self.num_blocks - self.free_uncached - len(self._evictable)

    @property
    def cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def match_prefix(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks of the chain that are cached."""
        n = 0
        for h in hashes:
            if h not in self._cached:
                break
            n += 1
        return n

    def can_allocate(self, new_blocks: int, hits: Sequence[int]) -> bool:
        # touching an evictable hit takes it out of the reusable set
        revived = sum(1 for h in hits if h in self._evictable)
        return new_blocks <= self.free_uncached + len(self._evictable) - revived

    def acquire(self, block_hash: int) -> None:
        entry = self._cached[block_hash]
        if entry.ref == 0:
            del self._evictable[block_hash]
        entry.ref += 1

    def allocate(self) -> bool:
        """Take one empty block, evicting the least recently used cached block if needed."""
        if self.free_uncached > 0:
            self.free_uncached -= 1
            return True
        if not self._evictable:
            return False
        victim, _ = self._evictable.popitem(last=False)
        del self._cached[victim]
        self.evictions += 1
        self._emit_removed(victim)
        return True

    def register(
        self,
        block_hash: int,
        parent: int | None,
        token_ids: Sequence[int],
        lora_id: int | None,
        lora_name: str | None,
    ) -> None:
        """Turn one allocated empty block into cached block ``block_hash`` held by the caller.

        If another request already cached the same content, the caller shares that block and the
        empty one goes back to the free set (no duplicate entries, no duplicate events).
        """
        if block_hash in self._cached:
            self.acquire(block_hash)
            self.free_uncached += 1
            return
        self._cached[block_hash] = _Cached(ref=1)
        self._emit_stored(block_hash, parent, token_ids, lora_id, lora_name)

    def release(self, blocks: Sequence[int | None]) -> None:
        """Drop a request's references; the chain's tail becomes evictable before its head."""
        for block in reversed(blocks):
            if block is None:
                self.free_uncached += 1
                continue
            entry = self._cached[block]
            entry.ref -= 1
            if entry.ref == 0:
                self._evictable[block] = None

    def adopt(
        self,
        chain: Sequence[int],
        token_ids: Sequence[int],
        lora_id: int | None,
        lora_name: str | None,
    ) -> int:
        """Blocks of ``chain`` received from another engine (a P/D KV transfer) join the cache.

        Missing blocks are allocated and registered (``BlockStored``), then released with the
        cached prefix, so they stay cached (evictable) for the request that pulled them and any
        later one. The cached prefix is held meanwhile so that allocating cannot evict it. Stops
        at the first block that cannot be allocated. Returns the leading blocks cached after.
        """
        bs = self.block_size
        start = self.match_prefix(chain)
        held: list[int | None] = []
        for h in chain[:start]:
            self.acquire(h)
            held.append(h)
        for i in range(start, len(chain)):
            if not self.allocate():
                break
            parent = chain[i - 1] if i else None
            self.register(chain[i], parent, token_ids[i * bs : (i + 1) * bs], lora_id, lora_name)
            held.append(chain[i])
        self.release(held)
        return len(held)

    def reset(self) -> bool:
        """vLLM's ``reset_prefix_cache``: only possible when no block is in use."""
        if self.used_blocks:
            return False
        self._cached.clear()
        self._evictable.clear()
        self.free_uncached = self.num_blocks
        if self.record_events:
            self.events.append(AllBlocksCleared())
        return True

    def drain_events(self) -> list[KVEvent]:
        events, self.events = self.events, []
        return events

    def _emit_stored(
        self,
        block_hash: int,
        parent: int | None,
        token_ids: Sequence[int],
        lora_id: int | None,
        lora_name: str | None,
    ) -> None:
        if not self.record_events:
            return
        last = self.events[-1] if self.events else None
        if (
            isinstance(last, BlockStored)
            and parent is not None
            and last.block_hashes[-1] == parent
            and last.lora_id == lora_id
        ):
            last.block_hashes.append(block_hash)
            last.token_ids.extend(token_ids)
            return
        self.events.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_block_hash=parent,
                token_ids=list(token_ids),
                block_size=self.block_size,
                lora_id=lora_id,
                lora_name=lora_name,
            )
        )

    def _emit_removed(self, block_hash: int) -> None:
        if not self.record_events:
            return
        last = self.events[-1] if self.events else None
        if isinstance(last, BlockRemoved):
            last.block_hashes.append(block_hash)
        else:
            self.events.append(BlockRemoved(block_hashes=[block_hash]))
