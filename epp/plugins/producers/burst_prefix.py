"""``burst-prefix-cache-producer`` (alpha): co-locate a burst of requests sharing a prompt (the
``n`` samples of an RL rollout group, say) so the shared prefix is prefilled once, not on every
replica while all caches are still cold and cache scorers see nothing.

Requests arriving within ``windowDurationMs`` of the first of a window wait together; when the
window closes they are placed jointly (``burst_assign``: identical prompts as one unit, kept on
one replica up to ``maxPerReplica``; with ``minColocateBlocks`` also requests sharing that many
leading blocks, within a fair share per replica; otherwise balanced by requests or prefix
blocks). Each request then gets ``PrefixCacheMatchInfo/<name>``: a full match
(``total_blocks`` of ``total_blocks``) on its assigned endpoint and 0 elsewhere; a request in no
unit, or without a prompt, gets 0 everywhere and is left to the other scorers. Pair it with
``prefix-cache-scorer`` (``prefixMatchInfoProducerName: <name>``); a persistent prefix producer
may run alongside for reuse across windows.

Blocks: the ``TokenizedPrompt`` of ``token-producer`` (created with defaults if not configured)
cut into ``blockSizeTokens`` blocks and chain-hashed with the target model and cache salt, as
``approx-prefix-cache-producer`` does; at most ``maxPrefixTokensToMatch / blockSizeTokens``
blocks per prompt (2048 when 0).

Every request waits up to the window, so its producer budget is the window plus 300 ms. A window
holding ``maxBatchSize`` requests refuses more: ``produce`` fails and the request is scheduled
without this producer's data (logged by the director, counted here).

Parameters:

- ``windowDurationMs`` (100; 1..10000): the batch window.
- ``maxPerReplica`` (-1 = unlimited, whole group on one replica; else >= 1): members of one
  group per replica.
- ``blockSizeTokens`` (64, > 0).
- ``maxPrefixTokensToMatch`` (0 = 2048 blocks; else >= ``blockSizeTokens``).
- ``minColocateBlocks`` (0 = only identical prompts are placed, balanced; >= 0).
- ``maxBatchSize`` (1000; -1 = unlimited; else >= 1).
- ``balanceBy`` (``requests`` | ``tokens``; "" = ``requests``).

Metrics: ``llm_d_epp_burst_prefix_requests_total{plugin_name, outcome}`` with ``outcome``
``colocated`` (given an endpoint), ``unplaced`` (no affinity) or ``batch_full``.

YAML::

    plugins:
      - type: burst-prefix-cache-producer
        parameters: {windowDurationMs: 100, maxPerReplica: -1, minColocateBlocks: 0}
      - type: prefix-cache-scorer
        parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}

Differences from upstream: none intended (requests a replica is assigned to that is no longer a
candidate get 0 everywhere, as upstream).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from prometheus_client import Counter

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    Stability,
    TokenizedPrompt,
)
from epp.plugin.metrics import metric_family
from epp.plugin.prefix import TOKEN_BYTES
from epp.plugins.producers.burst_assign import UNLIMITED, Chains, Entry, assign
from epp.plugins.producers.prefix_index import block_hashes, seed_hash

TOKEN_PRODUCER: Final = "token-producer"
TIMEOUT_MARGIN: Final = 0.3
DEFAULT_MAX_PREFIX_BLOCKS: Final = 2048
MAX_WINDOW_MS: Final = 10_000


@dataclass(eq=False)
class _Batch:
    entries: list[Entry] = field(default_factory=list)
    sealed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False


class BurstPrefixCacheProducer(PluginBase):
    TYPE: ClassVar[str] = "burst-prefix-cache-producer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        window_duration_ms: int = 100
        max_per_replica: int = UNLIMITED
        block_size_tokens: int = 64
        max_prefix_tokens_to_match: int = 0
        min_colocate_blocks: int = 0
        max_batch_size: int = 1000
        balance_by: Literal["requests", "tokens", ""] = "requests"

        def __post_init__(self) -> None:
            for ok, problem in _violations(self):
                if not ok:
                    raise ValueError(f"invalid configuration: {problem}")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self._log = handle.logger(self.typed_name)
        self.window = p.window_duration_ms / 1000
        self.max_blocks = (
            p.max_prefix_tokens_to_match // p.block_size_tokens
            if p.max_prefix_tokens_to_match > 0
            else DEFAULT_MAX_PREFIX_BLOCKS
        )
        self._key = PREFIX_MATCH_INFO.key(self.typed_name.name)
        self._input_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self._batch: _Batch | None = None
        self.outcomes = {"colocated": 0, "unplaced": 0, "batch_full": 0}
        self.windows = 0
        family = metric_family(
            handle.registry,
            Counter,
            "llm_d_epp_burst_prefix_requests",
            "Requests seen by the burst prefix producer, by outcome.",
            ("plugin_name", "outcome"),
        )
        self._counters = {o: family.labels(self.typed_name.name, o) for o in self.outcomes}
        self._log.info("burst prefix producer: %s", p)

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._input_key})

    def produce_timeout(self) -> float:
        return self.window + TIMEOUT_MARGIN

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        hashes = self.hash_prompt(request.target_model, request.attributes.get(self._input_key))
        entry = Entry(hashes, endpoints)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(self.window, self._seal, batch)
        limit = self.params.max_batch_size
        if limit != UNLIMITED and len(batch.entries) >= limit:
            self._count("batch_full")
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {limit} reached")
        batch.entries.append(entry)
        await batch.sealed.wait()
        total = sum(len(chain) for chain in hashes)
        size = self.params.block_size_tokens
        none = PrefixMatchInfo(0, total, size)
        infos = {ep.id: none for ep in endpoints}
        if entry.assigned in infos:
            infos[entry.assigned] = PrefixMatchInfo(total, total, size)
        elif entry.assigned is not None:
            self._log.debug("assigned %s is no candidate of %s", entry.assigned, request.request_id)
        self._count("colocated" if entry.assigned in infos else "unplaced")
        request.attributes[self._key] = infos

    def hash_prompt(self, target_model: str, prompt: TokenizedPrompt | None) -> Chains:
        """One hash chain per non-empty prompt."""
        if prompt is None:
            return ()
        seed = seed_hash(target_model, prompt.cache_salt)
        width = self.params.block_size_tokens * TOKEN_BYTES
        chains = (block_hashes(p, width, seed, self.max_blocks) for p in prompt.prompts)
        return tuple(chain for chain in chains if chain)

    def _seal(self, batch: _Batch) -> None:
        """The window closed: later requests start a new one; place this one, release it."""
        if batch.closed:
            return
        batch.closed = True
        if self._batch is batch:
            self._batch = None
        self.windows += 1
        p = self.params
        try:
            assign(
                batch.entries, p.max_per_replica, p.min_colocate_blocks, p.balance_by == "tokens"
            )
        except Exception:  # never leave a window's requests waiting
            self._log.exception("placing a burst window failed; its requests get no affinity")
            for e in batch.entries:
                e.assigned = None
        finally:
            batch.sealed.set()

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self._counters[outcome].inc()

    def dump_state(self) -> Mapping[str, Any]:
        batch = self._batch
        return {
            "windows": self.windows,
            "requests": dict(self.outcomes),
            "waiting": len(batch.entries) if batch else 0,
        }


def _violations(p: BurstPrefixCacheProducer.Params) -> list[tuple[bool, str]]:
    """Upstream's checks, in its order, with its messages."""
    tokens = p.max_prefix_tokens_to_match
    return [
        (p.window_duration_ms > 0, f"windowDurationMs must be > 0 (got {p.window_duration_ms})"),
        (
            p.window_duration_ms <= MAX_WINDOW_MS,
            f"windowDurationMs must be <= {MAX_WINDOW_MS} (got {p.window_duration_ms})",
        ),
        (
            p.max_per_replica == UNLIMITED or p.max_per_replica >= 1,
            f"maxPerReplica must be -1 (unlimited) or >= 1 (got {p.max_per_replica})",
        ),
        (p.block_size_tokens > 0, f"blockSizeTokens must be > 0 (got {p.block_size_tokens})"),
        (tokens >= 0, f"maxPrefixTokensToMatch must be >= 0 (got {tokens})"),
        (
            tokens == 0 or tokens >= p.block_size_tokens,
            f"maxPrefixTokensToMatch ({tokens}) must be 0 or >= blockSizeTokens "
            f"({p.block_size_tokens}); a smaller positive value yields zero prefix blocks",
        ),
        (
            p.min_colocate_blocks >= 0,
            f"minColocateBlocks must be >= 0 (got {p.min_colocate_blocks})",
        ),
        (
            p.max_batch_size == UNLIMITED or p.max_batch_size >= 1,
            f"maxBatchSize must be -1 (unlimited) or >= 1 (got {p.max_batch_size})",
        ),
    ]
