"""Applying KV events to the precise prefix index (spec §4.9).

``BlockStored`` (engine block size ``E`` from the event, EPP block size ``B``):

1. Skipped (and counted by reason) when the tokens are not whole engine blocks
   (``partial_tokens``), when ``len(tokens) != len(block_hashes) * E`` (``count_mismatch``),
   when neither of ``E`` and ``B`` divides the other (``block_size_mismatch``), when the parent
   engine hash is unknown on that endpoint (``unknown_parent``: stored before we subscribed, or
   evicted) or ends inside an EPP block (``unaligned_parent``).
2. The chain root is the parent's request key, or the model root for a first block; the model is
   the event's LoRA name when set, else the topic's model.
3. Request keys are computed for the full EPP blocks of the tokens (a partial tail is dropped).
   Extra keys per engine block are re-cut to EPP blocks: the LoRA name is dropped (it is already
   the model), ``cache_salt`` strings go to the first EPP block of their engine block, and
   multimodal items go to every EPP block of it (``E ≥ B``) or are merged (``E < B``).
4. Engine hash ``i`` maps to EPP keys ``i·k … i·k+k-1`` when ``E = k·B``, or to key ``i // k``
   when ``B = k·E`` (engine hashes that end inside an EPP block are marked so no chain can
   continue from them; trailing ones that do not complete an EPP block are not indexed).
5. A token-less store is a tier move (e.g. offload to CPU): the endpoint's known keys of those
   engine hashes are added under the new tier.

``BlockRemoved`` releases the engine hashes of that ``(tier, group)`` (a hash announced more than
once needs as many removals, see ``index``); ``AllBlocksCleared`` forgets everything the endpoint
holds.

KV-cache groups (hybrid models): an event that names its group (``group_idx``) is indexed only
when the group's attention kind serves prefix matches (``full_attention``, ``mla_attention``,
``sink_full_attention``). The kind comes with the event or was learned from an earlier event of
that group on that endpoint; a store of another kind, or of a group whose kind is unknown, is
skipped (``unsupported_cache_kind``), and so is a removal (or ``unknown_group`` when no store
named the group). Events without a group are indexed as before. Skips, and removed hashes
forwarded or suppressed, are reported to ``health``.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Final

from epp.plugins.producers.precise_prefix.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
)
from epp.plugins.producers.precise_prefix.health import EventHealth
from epp.plugins.producers.precise_prefix.index import UNALIGNED, Keys, PreciseIndex
from epp.plugins.producers.precise_prefix.keys import TOKEN_BYTES, Extra, ExtraItem, KeyHasher

EngineExtras = tuple[tuple[ExtraItem, ...] | None, ...] | None

PREFIX_KINDS: Final = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
"""KV-cache group kinds whose blocks a prompt prefix can match."""
MAX_GROUPS: Final = 64
"""Groups remembered per endpoint at most (engines have a handful)."""


class EventApplier:
    """Applies decoded event batches; ``applied`` and ``skipped`` count events by kind/reason,
    and ``on_count(outcome, label, n)`` (``outcome`` = ``applied`` | ``skipped``) mirrors them
    into metrics."""

    def __init__(
        self,
        index: PreciseIndex,
        hasher: KeyHasher,
        logger: logging.Logger,
        on_count: Callable[[str, str, int], None] | None = None,
        health: EventHealth | None = None,
    ) -> None:
        self.index = index
        self.hasher = hasher
        self._log = logger
        self._on_count = on_count or (lambda outcome, label, n: None)
        self._health = health
        self.applied: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self._warned: set[int] = set()
        self._groups: dict[str, dict[int, str]] = {}
        """Endpoint → KV-cache group → attention kind, as its events said."""

    def forget(self, endpoints: Collection[str]) -> None:
        """Endpoints that left: drop what was learned of their groups."""
        for endpoint in endpoints:
            self._groups.pop(endpoint, None)

    def apply(self, batch: EventBatch) -> None:
        if batch.malformed:
            self._skip("malformed", batch.malformed)
        for event in batch.events:
            if isinstance(event, BlockStored):
                kind = self._group_kind(batch.endpoint, event)
                reason = self.stored(batch.endpoint, batch.model, event, kind)
                if reason:
                    self._skip(reason)
                    if self._health is not None:
                        self._health.store_skipped(kind, reason)
                    if self._log.isEnabledFor(logging.DEBUG):
                        self._log.debug("BlockStored from %s skipped: %s", batch.endpoint, reason)
                else:
                    self._applied("stored")
            elif isinstance(event, BlockRemoved):
                self._removed(batch.endpoint, event)
            elif isinstance(event, AllBlocksCleared):
                self.index.clear_endpoint(batch.endpoint)
                self._applied("cleared")

    def _group_kind(self, endpoint: str, event: BlockStored) -> str:
        """The attention kind of the event's group (learning it when the event says)."""
        if not event.grouped:
            return ""
        groups = self._groups.get(endpoint)
        if event.kv_cache_spec_kind:
            if groups is None:
                groups = self._groups[endpoint] = {}
            if event.group_idx in groups or len(groups) < MAX_GROUPS:
                groups[event.group_idx] = event.kv_cache_spec_kind
            return event.kv_cache_spec_kind
        return groups.get(event.group_idx, "") if groups else ""

    def _removed(self, endpoint: str, event: BlockRemoved) -> None:
        if event.grouped:
            kind = self._groups.get(endpoint, {}).get(event.group_idx)
            if kind is None or kind not in PREFIX_KINDS:
                reason = "unknown_group" if kind is None else "unsupported_cache_kind"
                self._skip(reason)
                if self._health is not None:
                    self._health.removal_skipped(kind or "", reason)
                return
        index = self.index
        suppressed = index.removals_suppressed
        index.remove(endpoint, (event.medium, event.group_idx), event.block_hashes)
        if self._health is not None:
            suppressed = index.removals_suppressed - suppressed
            self._health.removals(len(event.block_hashes) - suppressed, suppressed)
        self._applied("removed")

    def _applied(self, kind: str) -> None:
        self.applied[kind] += 1
        self._on_count("applied", kind, 1)

    def _skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] += n
        self._on_count("skipped", reason, n)

    def stored(self, endpoint: str, model: str, event: BlockStored, kind: str = "") -> str:
        """Index one ``BlockStored`` (``kind``: its group's attention kind, for an event that
        names its group); returns the skip reason, ``""`` when applied."""
        if event.grouped and kind not in PREFIX_KINDS:
            return "unsupported_cache_kind"
        n = len(event.block_hashes)
        tokens = len(event.tokens) // TOKEN_BYTES
        source = (event.medium, event.group_idx)
        if n == 0:
            return "empty"
        if tokens == 0:
            pairs = self.index.tier_keys(endpoint, event.block_hashes)
            if not pairs:
                return "unknown_tier_move"
            self.index.add(endpoint, source, pairs)
            return ""
        engine = event.block_size or (tokens // n if tokens % n == 0 else 0)
        if engine <= 0 or tokens % engine:
            return "partial_tokens"
        if tokens != n * engine:
            return "count_mismatch"
        size = self.hasher.block_size
        if engine % size and size % engine:
            self._warn_block_size(engine)
            return "block_size_mismatch"
        if event.parent_block_hash is None:
            parent = self.hasher.model_root(event.lora_name or model)
        else:
            try:
                found = self.index.parent_key(endpoint, source, event.parent_block_hash)
            except KeyError:
                return "unknown_parent"
            if found is UNALIGNED or not isinstance(found, (int, tuple)):
                return "unaligned_parent"
            parent = found if isinstance(found, int) else found[-1]
        blocks = tokens // size
        extras = realign_extras(event.extra_keys, n, blocks, event.lora_name)
        keys = self.hasher.keys(parent, event.tokens, extras)
        pairs, mid = map_engine_hashes(event.block_hashes, keys, engine, size)
        self.index.add(endpoint, source, pairs, mid)
        return ""

    def _warn_block_size(self, engine: int) -> None:
        if engine not in self._warned and len(self._warned) < 16:
            self._warned.add(engine)
            self._log.warning(
                "engine block size %d and blockSizeTokens %d do not divide each other: "
                "its KV events are ignored (set blockSizeTokens to the engine's block size)",
                engine,
                self.hasher.block_size,
            )


def map_engine_hashes(
    engine_hashes: Sequence[int], keys: Sequence[int], engine: int, size: int
) -> tuple[list[tuple[int, Keys]], set[int]]:
    """Engine hash → EPP key(s), and the engine hashes that end inside an EPP block."""
    if engine >= size:
        k = engine // size
        if k == 1:
            return list(zip(engine_hashes, keys, strict=True)), set()
        return [(h, tuple(keys[i * k : (i + 1) * k])) for i, h in enumerate(engine_hashes)], set()
    k = size // engine
    pairs: list[tuple[int, Keys]] = []
    mid: set[int] = set()
    for i, h in enumerate(engine_hashes):
        block = i // k
        if block >= len(keys):
            break  # the tail does not complete an EPP block
        pairs.append((h, keys[block]))
        if (i + 1) % k:
            mid.add(h)
    return pairs, mid


def realign_extras(
    extra_keys: EngineExtras, engine_blocks: int, blocks: int, lora_name: str | None
) -> list[Extra] | None:
    """Per-engine-block extra keys → per-EPP-block extras (see the module docstring)."""
    if not extra_keys:
        return None
    cleaned = [
        _clean(extra_keys[i] if i < len(extra_keys) else None, lora_name)
        for i in range(engine_blocks)
    ]
    if not any(cleaned):
        return None
    out: list[list[ExtraItem]] = [[] for _ in range(blocks)]
    if blocks >= engine_blocks:
        k = blocks // engine_blocks
        for i, items in enumerate(cleaned):
            for item in items:
                if isinstance(item, str):
                    out[i * k].append(item)
                else:
                    for j in range(i * k, (i + 1) * k):
                        out[j].append(item)
    else:
        k = engine_blocks // blocks
        for i, items in enumerate(cleaned):
            if i // k < blocks:
                out[i // k].extend(item for item in items if item not in out[i // k])
    return [tuple(items) if items else None for items in out]


def _clean(items: tuple[ExtraItem, ...] | None, lora_name: str | None) -> tuple[ExtraItem, ...]:
    if not items:
        return ()
    return tuple(item for item in items if item != lora_name)
