"""``approx-prefix-cache-producer``: which endpoints probably cache the request's prompt prefix.

The EPP cannot see the engines' KV caches, so it remembers where it sent each prompt: after a
request is scheduled (PreRequest) the chained hashes of its prompt blocks are recorded against
the chosen endpoint; before the next request is scheduled (produce) its hashes are looked up and
every candidate endpoint gets a ``PrefixMatchInfo`` in
``request.attributes["PrefixCacheMatchInfo/<name>"]`` (read by ``prefix-cache-scorer``).

Algorithm (spec §4.8):

- Input: ``request.attributes["TokenizedPrompt/token-producer"]`` (each prompt hashed on its own;
  a missing prompt gives every endpoint ``PrefixMatchInfo(0, 0, block size)``).
- Block size: ``blockSizeTokens``; with ``autoTune`` the first candidate's scraped
  ``cache_block_size`` wins when > 0; the result is then raised to at least 64 tokens, because the
  index holds one entry per (endpoint, block) and engine-sized blocks of 16 would quadruple it.
- Cap: ``maxPrefixTokensToMatch > 0`` gives ``tokens // blockSize`` blocks, else
  ``maxPrefixBlocksToMatch``; both 0 means no cap.
- Hashes: see ``epp.plugins.producers.prefix_index`` (xxh64 chain seeded by target model + salt).
  A prompt of at least 128 blocks that extends one of the last 32 hashed (an agent's next turn:
  the whole conversation again, plus the answer and a tool result) reuses that prompt's hashes
  and hashes only its new blocks (``ChainCache``: at most 8 MiB of those prompts' token bytes,
  a fixed amount whatever the load; the chain is the same). ``/debug/plugins/state`` shows its
  prompts, bytes, hits and misses (``hashCache``).
- Match: per prompt, each endpoint's number of consecutive leading blocks in the index, summed
  over prompts; ``total_blocks`` is the number of hashes over all prompts. Past a prompt's first
  16 blocks the index holds one block in ``indexStride`` (the last of each group, standing for
  the group), so a long match is reported to its last whole group: at most ``indexStride - 1``
  blocks short (448 tokens in 64-token blocks), for an index and a sharing cost about
  ``indexStride`` times smaller on long prompts (``epp.plugins.producers.prefix_index``).
- PreRequest: all hashes are added to the primary profile's first target and, when a ``prefill``
  profile picked one, to its first target too. An endpoint's LRU holds what its KV cache holds:
  with ``autoTune`` and scraped ``cache_num_blocks`` > 0, ``cache_num_blocks * cache_block_size /
  blockSize`` index blocks, else ``lruCapacityPerServer`` blocks. (Upstream uses
  ``cache_num_blocks`` as is, counting 16-token engine blocks as 64-token index blocks: it
  believes a pod caches four times what it does, and keeps routing to prefixes the pod has
  evicted.) Endpoints that left the pool are purged, at most every 2 s.

Shared state (active-active replicas, ``epp.plugin.sharing``): with a cross-replica syncer the
producer exports, every sync interval, what its PreRequests added since the last export, one fact
per chain ``[endpoint id, capacity in index blocks, [indexed block hashes in prompt order],
indexStride]``, each endpoint's oldest first: a chain that a later one of the same endpoint
contains is left out, at most 65,536 pending (endpoint, entry) pairs are kept (the oldest dropped
and counted), and a fact without the stride names every block of its chain. A replica with
another ``indexStride`` skips the facts and says so. Facts of other replicas are added to the
local index, in order, as if this replica had routed those requests (an agent's next turn costs
the receiver its new blocks, not its length), with the capacity the other replica computed from
the same scraped metrics, and are not exported again (no echo). Duplicates only refresh recency
and a lost fact only costs a miss. Nothing is buffered until a syncer asks for facts. A request
whose primary target did not hold all of its blocks (new blocks, the next turn of a conversation
may follow at once) asks for prompt sharing (``Handle.share_soon``); a full hit only refreshes
recency and waits for the interval.

Parameters:

- ``blockSizeTokens`` (int, default 16, ≥ 0; > 0 when ``autoTune`` is false). ``blockSize`` is its
  deprecated alias, used when ``blockSizeTokens`` is left at its default.
- ``autoTune`` (bool, default true).
- ``maxPrefixTokensToMatch`` (int, default 131072, ≥ 0), ``maxPrefixBlocksToMatch`` (int, default
  2048, ≥ 0).
- ``lruCapacityPerServer`` (int, default 31250, ≥ 0; 0 = default).
- ``indexStride`` (int, default 8, ≥ 1): past the first 16 blocks, one block in this many is
  indexed; 1 indexes every block, as upstream does.

Metrics (on the App's registry, labels ``plugin_name``, ``plugin_type``; unlabeled deprecated
twins ``inference_extension_prefix_indexer_*``): ``llm_d_epp_prefix_indexer_size`` (the
(endpoint, block) pairs the index stands for, what the capacities bound),
``llm_d_epp_prefix_indexer_hit_ratio`` and ``llm_d_epp_prefix_indexer_hit_bytes`` (per scheduled
request, for its primary target; bytes = blocks * block size * 4); with sharing,
``llm_d_epp_prefix_indexer_sync_dropped_blocks_total`` (pending pairs dropped unexported).

YAML::

    plugins:
      - type: approx-prefix-cache-producer
        parameters:
          autoTune: false
          blockSizeTokens: 128
          lruCapacityPerServer: 50000
      - type: prefix-cache-scorer
"""

from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugin.fastmetrics import FastHistogram
from epp.plugin.metrics import metric_family
from epp.plugin.prefix import TOKEN_BYTES
from epp.plugins.producers.prefix_index import (
    STRIDE,
    ChainCache,
    PendingBlocks,
    PrefixIndex,
    seed_hash,
)

MIN_BLOCK_SIZE_TOKENS: Final = 64
DEFAULT_LRU_CAPACITY: Final = 31250
PURGE_INTERVAL: Final = 2.0
"""Seconds between purges of endpoints that left the pool (checked on PreRequest)."""
PREFILL_PROFILE: Final = "prefill"
TOKEN_PRODUCER: Final = "token-producer"
MAX_DUMPED_ENDPOINTS: Final = 100
MAX_PENDING_BLOCKS: Final = 65536
"""(endpoint, block) pairs learned since the last export that are kept for other replicas."""

_RATIO_BUCKETS: Final[tuple[float, ...]] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_BYTES_BUCKETS: Final[tuple[float, ...]] = (0, *(16 * 2**i for i in range(13)))  # 16 .. 65536
_LABELS: Final = ("plugin_name", "plugin_type")
_FAMILIES: Final[dict[str, tuple[type[Gauge] | type[Histogram], str, tuple[float, ...]]]] = {
    "size": (Gauge, "Size of the prefix indexer.", ()),
    "hit_ratio": (
        Histogram,
        "Ratio of prefix length matched to total prefix length in the cache lookup.",
        _RATIO_BUCKETS,
    ),
    "hit_bytes": (
        Histogram,
        "Length of the prefix match in number of bytes in the cache lookup.",
        _BYTES_BUCKETS,
    ),
}


@dataclass(frozen=True, slots=True)
class _Hashed:
    """What produce leaves for PreRequest so the prompt is hashed once per request."""

    per_prompt: tuple[list[int], ...]
    matches: Mapping[str, int]
    total_blocks: int
    block_size: int


class ApproxPrefixCacheProducer(PluginBase):
    TYPE: ClassVar[str] = "approx-prefix-cache-producer"

    @dataclass(frozen=True)
    class Params:
        block_size_tokens: int = 16
        block_size: int = 0
        auto_tune: bool = True
        max_prefix_tokens_to_match: int = 131072
        max_prefix_blocks_to_match: int = 2048
        lru_capacity_per_server: int = DEFAULT_LRU_CAPACITY
        index_stride: int = STRIDE

        def __post_init__(self) -> None:
            for key, value in (
                ("blockSizeTokens", self.block_size_tokens),
                ("blockSize", self.block_size),
                ("maxPrefixTokensToMatch", self.max_prefix_tokens_to_match),
                ("maxPrefixBlocksToMatch", self.max_prefix_blocks_to_match),
                ("lruCapacityPerServer", self.lru_capacity_per_server),
            ):
                if value < 0:
                    raise ValueError(f"{key} must be >= 0, got {value}")
            if self.index_stride < 1:
                raise ValueError(f"indexStride must be >= 1, got {self.index_stride}")
            if not self.auto_tune and self.effective_block_size_tokens <= 0:
                raise ValueError("blockSizeTokens must be > 0 when autoTune is false")

        @property
        def effective_block_size_tokens(self) -> int:
            """``blockSize`` (deprecated) applies only when ``blockSizeTokens`` is the default."""
            if self.block_size > 0 and self.block_size_tokens == 16:
                return self.block_size
            return self.block_size_tokens

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self._log = handle.logger(self.typed_name)
        if p.block_size > 0:
            self._log.warning("parameter blockSize is deprecated; use blockSizeTokens")
        self._block_size_tokens = p.effective_block_size_tokens
        if 0 < self._block_size_tokens < MIN_BLOCK_SIZE_TOKENS:
            # Info, not warning: the default (16, the engines' usual size) always lands here.
            self._log.info(
                "blockSizeTokens %d is below the minimum; %d is used",
                self._block_size_tokens,
                MIN_BLOCK_SIZE_TOKENS,
            )
        self._key = PREFIX_MATCH_INFO.key(self.typed_name.name)
        self._state_key = f"{self.TYPE}:{self.typed_name.name}:hashes"  # private scratch
        self._input_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self._default_capacity = p.lru_capacity_per_server or DEFAULT_LRU_CAPACITY
        self.index = PrefixIndex(self._default_capacity, stride=p.index_stride)
        self.chains = ChainCache()  # an agent's next turn hashes only its new blocks
        self._last_purge = handle.clock()
        self._metrics = _IndexerMetrics(handle.registry, self.typed_name.name, self.TYPE)
        self._pending: PendingBlocks | None = None  # created when a syncer first asks

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._input_key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.compute(request, endpoints)

    def compute(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, PrefixMatchInfo]:
        """Hash the prompt, match it against the index and publish the per-endpoint infos."""
        block_size = self.block_size(endpoints)
        prompt = request.attributes.get(self._input_key)
        per_prompt = self.hash_prompt(request.target_model, prompt, block_size)
        matches: dict[str, int] = {}
        for hashes in per_prompt:
            for ep, n in self.index.match(hashes).items():
                matches[ep] = matches.get(ep, 0) + n
        total = sum(len(h) for h in per_prompt)
        none = PrefixMatchInfo(0, total, block_size)
        infos = {
            ep.id: PrefixMatchInfo(matches[ep.id], total, block_size) if ep.id in matches else none
            for ep in endpoints
        }
        request.attributes[self._key] = infos
        request.attributes[self._state_key] = _Hashed(per_prompt, matches, total, block_size)
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug(
                "request %s: %d blocks of %d tokens, matches %s",
                request.request_id,
                total,
                block_size,
                matches,
            )
        return infos

    def block_size(self, endpoints: Sequence[Endpoint]) -> int:
        size = self._block_size_tokens
        if self.params.auto_tune and endpoints:
            metrics = endpoints[0].metrics
            if metrics is not None and metrics.cache_block_size > 0:
                size = metrics.cache_block_size
        return max(size, MIN_BLOCK_SIZE_TOKENS)

    def max_blocks(self, block_size: int) -> int | None:
        """The per-prompt block cap; ``None`` = unlimited."""
        p = self.params
        if p.max_prefix_tokens_to_match > 0:
            return p.max_prefix_tokens_to_match // block_size
        if p.max_prefix_blocks_to_match == 0:
            return None
        return p.max_prefix_blocks_to_match

    def hash_prompt(
        self, target_model: str, prompt: TokenizedPrompt | None, block_size: int
    ) -> tuple[list[int], ...]:
        """One hash chain per non-empty prompt."""
        if prompt is None:
            return ()
        seed = seed_hash(target_model, prompt.cache_salt)
        cap = self.max_blocks(block_size)
        hashes = self.chains.hashes
        chains = (hashes(p, block_size * TOKEN_BYTES, seed, cap) for p in prompt.prompts)
        return tuple(chain for chain in chains if chain)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self._maybe_purge()
        state: _Hashed | None = request.attributes.pop(self._state_key, None)  # used once
        primary = result.profile_results.get(result.primary_profile)
        if state is None or primary is None or not primary.targets:
            return
        target = primary.targets[0]
        targets = [target]
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.targets and prefill.targets[0].id != target.id:
            targets.append(prefill.targets[0])
        pending = self._pending
        for ep in targets:
            capacity = self._capacity(ep, state.block_size)
            for hashes in state.per_prompt:
                entries = self.index.indexed(hashes[:capacity])
                self.index.add_indexed(ep.id, entries, capacity)
                if pending is not None:
                    pending.add(ep.id, entries, capacity)
        self._metrics.size(self.index.size)
        matched = state.matches.get(target.id, 0)
        reachable = self.index.reachable
        if pending is not None and matched < sum(map(reachable, map(len, state.per_prompt))):
            self.handle.share_soon()  # new blocks: the other replicas should route by them now
        unit = state.block_size * TOKEN_BYTES  # bytes per block, as upstream reports it
        self._metrics.hit(matched * unit, state.total_blocks * unit)

    def _capacity(self, endpoint: Endpoint, block_size: int) -> int:
        """How many index blocks of ``block_size`` tokens the endpoint's KV cache holds."""
        metrics = endpoint.metrics
        if self.params.auto_tune and metrics is not None and metrics.cache_num_blocks > 0:
            # The engine counts blocks of its own size; index blocks are larger (at least 64
            # tokens), so the same memory holds proportionally fewer of them.
            engine_block = metrics.cache_block_size or block_size
            return max(1, metrics.cache_num_blocks * engine_block // block_size)
        return self._default_capacity

    def _maybe_purge(self) -> None:
        now = self.handle.clock()
        if now - self._last_purge < PURGE_INTERVAL:
            return
        self._last_purge = now
        gone = self.index.retain({ep.id for ep in self.handle.endpoints()})
        if gone:
            self._metrics.size(self.index.size)
            self._log.info("dropped %d endpoints that left the pool from the index", len(gone))

    def export_facts(self) -> list[Any]:
        """What PreRequest learned since the last call (``SharedState``), one fact per chain."""
        if self._pending is None:
            dropped = metric_family(
                self.handle.registry,
                Counter,
                "llm_d_epp_prefix_indexer_sync_dropped_blocks",
                "Learned (endpoint, block) pairs dropped before other replicas got them.",
                _LABELS,
            ).labels(self.typed_name.name, self.TYPE)
            self._pending = PendingBlocks(MAX_PENDING_BLOCKS, on_drop=dropped.inc)
        stride = self.index.stride
        return [[*fact, stride] for fact in self._pending.drain()]

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        """Add another replica's facts to the index (``SharedState``); never re-exported. Malformed
        facts are skipped, then reported by a ValueError once the others are applied."""
        bad = strides = 0
        for fact in facts:
            parsed = _parse_fact(fact)
            if parsed is None:
                bad += 1
                continue
            endpoint, capacity, hashes, stride = parsed
            if stride is None:  # a whole chain
                self.index.add(endpoint, hashes, capacity)
            elif stride == self.index.stride:
                self.index.add_indexed(endpoint, hashes, capacity)
            else:
                strides += 1
        self._metrics.size(self.index.size)
        if bad:
            raise ValueError(f"{bad} of {len(facts)} facts from {origin} are malformed")
        if strides:
            raise ValueError(
                f"{strides} of {len(facts)} facts from {origin} were skipped: they index another "
                f"indexStride than this replica's {self.index.stride} (configure the same on all)"
            )

    def dump_state(self) -> Mapping[str, Any]:
        """Per-endpoint block counts (largest first, at most 100); never the hashes."""
        counts = sorted(self.index.block_counts().items(), key=lambda kv: (-kv[1], kv[0]))
        return {
            "endpoints": [{"endpoint": ep, "blocks": n} for ep, n in counts[:MAX_DUMPED_ENDPOINTS]],
            "totalEndpoints": len(counts),
            "entries": self.index.entries,
            "blocks": self.index.size,
            "approxBytes": self.index.approx_bytes(),
            **({"pendingBlocks": len(self._pending)} if self._pending is not None else {}),
            "hashCache": {  # ``ChainCache``: prompts that extended a cached one (hits)
                "prompts": len(self.chains),
                "bytes": self.chains.held_bytes,
                "hits": self.chains.hits,
                "misses": self.chains.misses,
            },
        }


def _parse_fact(fact: Any) -> tuple[str, int, list[int], int | None] | None:
    """``[endpoint id, capacity, [indexed hashes], stride]`` (or ``[..., [hashes]]``, a whole
    chain) checked, or ``None``."""
    if not isinstance(fact, (list, tuple)) or len(fact) not in (3, 4):
        return None
    endpoint, capacity, hashes, *rest = fact
    stride = rest[0] if rest else None
    if not isinstance(endpoint, str) or not endpoint or type(capacity) is not int or capacity <= 0:
        return None
    if stride is not None and (type(stride) is not int or stride < 1):
        return None
    if not isinstance(hashes, list):
        return None
    try:  # one C-level pass (a fact may carry thousands of hashes): ints in 0 .. 2**64 - 1
        array("Q", hashes)
    except (TypeError, OverflowError):
        return None
    return endpoint, capacity, hashes, stride


class _IndexerMetrics:
    """The prefix indexer families on one registry: each canonical family (labelled with the
    plugin's name and type) is written together with its unlabelled deprecated twin."""

    def __init__(self, registry: CollectorRegistry, name: str, type_name: str) -> None:
        self._pairs: dict[str, tuple[Any, Any]] = {}
        for suffix, (kind, doc, buckets) in _FAMILIES.items():
            canonical = f"llm_d_epp_prefix_indexer_{suffix}"
            labelled = _family(registry, kind, canonical, doc, _LABELS, buckets)
            twin = _family(
                registry,
                kind,
                f"inference_extension_prefix_indexer_{suffix}",
                f"[Deprecated: Use {canonical}] {doc}",
                (),
                buckets,
            )
            self._pairs[suffix] = (labelled.labels(name, type_name), twin)

    def size(self, entries: int) -> None:
        for metric in self._pairs["size"]:
            metric.set(entries)

    def hit(self, matched_bytes: int, total_bytes: int) -> None:
        for metric in self._pairs["hit_bytes"]:
            metric.observe(matched_bytes)
        if total_bytes > 0:
            for metric in self._pairs["hit_ratio"]:
                metric.observe(matched_bytes / total_bytes)


def _family(
    registry: CollectorRegistry,
    kind: type[Gauge] | type[Histogram],
    name: str,
    doc: str,
    labels: Sequence[str],
    buckets: Sequence[float],
) -> Any:
    if kind is Histogram:  # observed in pre_request, on the loop: the lock-free kind
        return metric_family(
            registry, FastHistogram, name, doc, labels, buckets=(*buckets, math.inf)
        )
    return metric_family(registry, kind, name, doc, labels)
