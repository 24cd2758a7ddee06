"""The precise prefix index: which endpoints hold which request keys, as their KV events say.

Layout (pure, synchronous, bounded):

- ``owners``: request key → tuple of endpoint ids holding it, in LRU order over keys (an
  ``OrderedDict``). At most ``capacity`` keys; inserting one more evicts the least recently
  stored or matched key. At most ``owners_per_key`` endpoints per key (the oldest owner goes).
- per endpoint, one *source* per ``(device tier, KV group)`` the engine reports, each with
  ``engine``: engine block hash → request key(s) (one key, or a tuple when one engine block spans
  several EPP blocks), and ``refs``: request key → number of distinct engine hashes of that source
  mapping to it. A key stays owned by the endpoint while any of its sources references it, and
  a ``BlockRemoved`` only releases the key when its count reaches zero.
- removal dedup (upstream's): a ``BlockStored`` that repeats an engine hash its source already
  holds (vLLM's chunked offloading re-announces shared blocks) adds nothing but is counted
  (``repeats``), and each ``BlockRemoved`` of that hash then consumes one count instead of
  releasing it; only the removal of the last announcement releases. Suppressed removals are
  summed in ``removals_suppressed``; removals of unknown hashes pass through (they release
  nothing).
- speculative entries (source tier ``speculative``): keys added on PreRequest for the chosen
  endpoint with a deadline; a real store of the key confirms (drops) them, the deadline removes
  them otherwise.

``match`` walks a request's keys in order and stops at the first key nobody holds, so it costs
O(matched blocks) whatever the number of endpoints; keys are produced lazily by the caller, so
the unmatched tail is never hashed.

Memory: ``BYTES_PER_BLOCK`` estimates one (endpoint, key) entry with its engine mapping, measured
with ``tracemalloc`` on CPython 3.11 (see the unit test); ``approx_bytes`` is entries times that.
Engine mappings of keys evicted by the LRU are swept once they make up half of a source.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

BYTES_PER_BLOCK: Final = 330
"""Estimated bytes per indexed (endpoint, block) pair held by one engine hash: the LRU node and
owners slot of the key, the source's refcount slot and its engine-hash mapping. Measured between
150 (keys held by several endpoints) and 290 bytes (one endpoint, depending on where the dicts
are in their growth), ``tests/unit/plugins/producers/precise_prefix/test_index.py``;
the estimate errs high."""

SPECULATIVE: Final = "speculative"
MAX_SPECULATIVE: Final = 65536
"""Pending speculative insertions kept at most; older ones expire early."""
_SWEEP_MIN: Final = 1024

SourceKey = tuple[str, int]
"""``(device tier, KV-cache group)`` of an engine's blocks."""
Keys = int | tuple[int, ...]


class Unaligned:
    """Marker: the engine hash ends inside an EPP block, so no chain can continue from it."""


UNALIGNED: Final = Unaligned()


@dataclass(slots=True)
class _Source:
    engine: dict[int, Keys] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)
    mid: set[int] = field(default_factory=set)
    repeats: dict[int, int] = field(default_factory=dict)
    """Engine hash → announcements beyond the first not yet removed."""
    dangling: int = 0


def _as_tuple(keys: Keys) -> tuple[int, ...]:
    return (keys,) if isinstance(keys, int) else keys


class PreciseIndex:
    def __init__(self, capacity: int, owners_per_key: int = 10) -> None:
        if capacity <= 0 or owners_per_key <= 0:
            raise ValueError("capacity and owners_per_key must be > 0")
        self.capacity = capacity
        self.owners_per_key = owners_per_key
        self._owners: OrderedDict[int, tuple[str, ...]] = OrderedDict()
        self._endpoints: dict[str, dict[SourceKey, _Source]] = {}
        self._singles: dict[str, tuple[str]] = {}
        self._speculative: deque[tuple[float, str, tuple[int, ...]]] = deque()
        self.entries = 0
        self.evictions = 0
        self.removals_suppressed = 0

    # ---- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of distinct request keys held by at least one endpoint."""
        return len(self._owners)

    def owners(self, key: int) -> tuple[str, ...]:
        return self._owners.get(key, ())

    def approx_bytes(self) -> int:
        return self.entries * BYTES_PER_BLOCK

    def engine_mappings(self) -> int:
        return sum(len(s.engine) for srcs in self._endpoints.values() for s in srcs.values())

    def block_counts(self) -> dict[str, dict[str, int]]:
        """Endpoint → ``tier[/group]`` → number of keys that source references."""
        return {
            ep: {_label(sk): len(src.refs) for sk, src in sources.items() if src.refs}
            for ep, sources in self._endpoints.items()
        }

    def match(self, keys: Iterable[int]) -> dict[str, int]:
        """Endpoint → number of leading keys of ``keys`` it holds consecutively.

        Consumes ``keys`` only up to the first key nobody holds (or until every endpoint has
        dropped out). Matched keys count as recently used."""
        owners_of = self._owners
        touch = owners_of.move_to_end
        result: dict[str, int] = {}
        alive: set[str] = set()
        previous: tuple[str, ...] = ()
        depth = 0
        for key in keys:
            held = owners_of.get(key)
            if held is None:
                break
            touch(key)
            if held != previous:
                if depth == 0:
                    alive.update(held)
                else:
                    dropped = alive.difference(held)
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

    def parent_key(self, endpoint: str, source: SourceKey, engine_hash: int) -> Keys | Unaligned:
        """The request key(s) ``engine_hash`` maps to on ``endpoint`` (its own source first), or
        ``UNALIGNED``; ``KeyError`` when the endpoint never reported it (or it was evicted)."""
        sources = self._endpoints.get(endpoint)
        if not sources:
            raise KeyError(engine_hash)
        ordered = [sources[source]] if source in sources else []
        ordered += [s for k, s in sources.items() if k != source]
        for src in ordered:
            keys = src.engine.get(engine_hash)
            if keys is not None:
                if engine_hash in src.mid:
                    return UNALIGNED
                if all(k in src.refs for k in _as_tuple(keys)):
                    return keys
        raise KeyError(engine_hash)

    # ---- events -------------------------------------------------------------------------------

    def add(
        self,
        endpoint: str,
        source: SourceKey,
        pairs: Iterable[tuple[int, Keys]],
        mid: Collection[int] = (),
    ) -> int:
        """Record engine hashes with their request keys; returns how many were new.

        ``mid`` are engine hashes that end inside an EPP block (engine blocks smaller than EPP
        blocks): they reference the key of the block they belong to but cannot be a parent."""
        sources = self._endpoints.setdefault(endpoint, {})
        src = sources.get(source)
        if src is None:
            src = sources[source] = _Source()
        spec = sources.get((SPECULATIVE, 0)) if source[0] != SPECULATIVE else None
        added = 0
        for engine_hash, keys in pairs:
            if engine_hash in src.engine:
                # announced again: indexed once, and one more removal before it is released
                src.repeats[engine_hash] = src.repeats.get(engine_hash, 0) + 1
                continue
            src.engine[engine_hash] = keys
            if engine_hash in mid:
                src.mid.add(engine_hash)
            added += 1
            for key in _as_tuple(keys):
                self._incref(endpoint, src, key)
                if spec is not None and spec.refs.pop(key, None) is not None:
                    pass  # confirmed: the real source holds the key from now on
        return added

    def remove(self, endpoint: str, source: SourceKey, engine_hashes: Iterable[int]) -> int:
        """Release engine hashes (a repeated announcement absorbs one removal, see the module
        docstring); returns how many were released."""
        sources = self._endpoints.get(endpoint)
        src = sources.get(source) if sources else None
        if src is None:
            return 0
        known = 0
        repeats = src.repeats
        for engine_hash in engine_hashes:
            extra = repeats.get(engine_hash)
            if extra:
                if extra > 1:
                    repeats[engine_hash] = extra - 1
                else:
                    del repeats[engine_hash]
                self.removals_suppressed += 1
                continue
            keys = src.engine.pop(engine_hash, None)
            if keys is None:
                continue
            src.mid.discard(engine_hash)
            known += 1
            for key in _as_tuple(keys):
                self._decref(endpoint, src, key)
        return known

    def clear_endpoint(self, endpoint: str) -> int:
        """Forget everything ``endpoint`` holds (``AllBlocksCleared``, or it left the pool);
        returns the number of keys it owned."""
        sources = self._endpoints.pop(endpoint, None)
        if not sources:
            return 0
        keys = {key for src in sources.values() for key in src.refs}
        for key in keys:
            self._drop_owner(key, endpoint)
        self._singles.pop(endpoint, None)
        return len(keys)

    def retain(self, live: Collection[str]) -> list[str]:
        """Drop every endpoint not in ``live``; returns the dropped ids."""
        gone = [ep for ep in self._endpoints if ep not in live]
        for ep in gone:
            self.clear_endpoint(ep)
        return gone

    def tier_keys(self, endpoint: str, engine_hashes: Sequence[int]) -> list[tuple[int, Keys]]:
        """The known keys of ``engine_hashes`` on ``endpoint`` in any source (for token-less
        stores that only move blocks to another tier)."""
        sources = self._endpoints.get(endpoint, {})
        out = []
        for engine_hash in engine_hashes:
            for src in sources.values():
                keys = src.engine.get(engine_hash)
                if keys is not None and engine_hash not in src.mid:
                    out.append((engine_hash, keys))
                    break
        return out

    # ---- speculative entries -----------------------------------------------------------------

    def add_speculative(self, endpoint: str, keys: Sequence[int], deadline: float) -> None:
        if not keys:
            return
        sources = self._endpoints.setdefault(endpoint, {})
        spec = sources.get((SPECULATIVE, 0))
        if spec is None:
            spec = sources[(SPECULATIVE, 0)] = _Source()
        for key in keys:
            self._incref(endpoint, spec, key)
        self._speculative.append((deadline, endpoint, tuple(keys)))
        while len(self._speculative) > MAX_SPECULATIVE:
            self._expire_one()

    def expire(self, now: float) -> int:
        """Remove speculative entries whose deadline passed; returns how many batches."""
        expired = 0
        queue = self._speculative
        while queue and queue[0][0] <= now:
            self._expire_one()
            expired += 1
        return expired

    def _expire_one(self) -> None:
        _, endpoint, keys = self._speculative.popleft()
        spec = self._endpoints.get(endpoint, {}).get((SPECULATIVE, 0))
        if spec is None:
            return
        for key in keys:
            self._decref(endpoint, spec, key)

    # ---- reference counting ------------------------------------------------------------------

    def _incref(self, endpoint: str, src: _Source, key: int) -> None:
        count = src.refs.get(key)
        if count:
            src.refs[key] = count + 1
            self._owners.move_to_end(key)
            return
        src.refs[key] = 1
        held = self._owners.get(key)
        if held is None:
            single = self._singles.get(endpoint)
            if single is None:
                single = self._singles[endpoint] = (endpoint,)
            self._owners[key] = single
            self.entries += 1
            if len(self._owners) > self.capacity:
                self._evict_oldest()
            return
        self._owners.move_to_end(key)
        if endpoint in held:
            return
        if len(held) >= self.owners_per_key:
            self._forget_owner(key, held[0])
            held = self._owners[key]
        self._owners[key] = (*held, endpoint)
        self.entries += 1

    def _decref(self, endpoint: str, src: _Source, key: int) -> None:
        count = src.refs.get(key)
        if count is None:
            return  # evicted by the LRU earlier
        if count > 1:
            src.refs[key] = count - 1
            return
        del src.refs[key]
        sources = self._endpoints.get(endpoint, {})
        if any(key in other.refs for other in sources.values()):
            return
        self._drop_owner(key, endpoint)

    def _drop_owner(self, key: int, endpoint: str) -> None:
        held = self._owners.get(key)
        if held is None or endpoint not in held:
            return
        rest = tuple(ep for ep in held if ep != endpoint)
        if rest:
            self._owners[key] = rest
        else:
            del self._owners[key]
        self.entries -= 1

    def _forget_owner(self, key: int, endpoint: str) -> None:
        """Take ``key`` away from ``endpoint`` whatever its counts (capacity pressure)."""
        for src in self._endpoints.get(endpoint, {}).values():
            if src.refs.pop(key, None) is not None:
                self._note_dangling(src)
        self._drop_owner(key, endpoint)

    def _evict_oldest(self) -> None:
        key, held = self._owners.popitem(last=False)
        self.entries -= len(held)
        self.evictions += 1
        for endpoint in held:
            for src in self._endpoints.get(endpoint, {}).values():
                if src.refs.pop(key, None) is not None:
                    self._note_dangling(src)

    def _note_dangling(self, src: _Source) -> None:
        """Engine mappings of evicted keys stay until their BlockRemoved; sweep them once they
        are half of the source, so lost removals cannot grow memory without bound."""
        src.dangling += 1
        if src.dangling < max(_SWEEP_MIN, len(src.engine) // 2):
            return
        refs = src.refs
        stale = [h for h, keys in src.engine.items() if not any(k in refs for k in _as_tuple(keys))]
        for h in stale:
            del src.engine[h]
            src.mid.discard(h)
            src.repeats.pop(h, None)
        src.dangling = 0

    def summary(self) -> Mapping[str, Any]:
        return {
            "keys": len(self._owners),
            "entries": self.entries,
            "capacity": self.capacity,
            "engineMappings": self.engine_mappings(),
            "evictions": self.evictions,
            "pendingSpeculative": len(self._speculative),
            "bytesPerBlock": BYTES_PER_BLOCK,
            "approxBytes": self.approx_bytes(),
        }


def _label(source: SourceKey) -> str:
    tier, group = source
    return tier if group == 0 else f"{tier}/{group}"
