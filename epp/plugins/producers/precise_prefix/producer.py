"""``precise-prefix-cache-producer``: which endpoints hold the request's prompt prefix, as the
engines' own KV-cache events report it (spec §4.9).

Each model server publishes ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` events over
ZMQ (``events``, ``kvevents``). The producer recomputes its own *request keys* from the events'
token ids (``keys``; engine hashes are opaque), indexes them per endpoint (``index``, applied by
``ingest``) and, before scheduling, hashes the request's prompt the same way and publishes
``PrefixCacheMatchInfo/<name>``: for every candidate
``PrefixMatchInfo(match_blocks, total_blocks, blockSizeTokens)``, where ``match_blocks`` is the
number of leading blocks of each prompt the endpoint holds consecutively (summed over prompts)
and ``total_blocks`` the number of full blocks. Pair it with ``prefix-cache-scorer``
(``prefixMatchInfoProducerName: <name>``).

The prompt's token ids come from ``TokenizedPrompt/token-producer``; they must be the engine's
own: use ``token-producer`` with ``backend: vllm`` against vLLM. Against the simulator
(``epp_tools.sim``) the ``estimate`` backend is exact for completions: the simulator's tokenizer is
the same 4-bytes-per-token rule (chat prompts differ: it renders a chat template; use ``vllm``).

Subscriptions: with ``discoverPods`` (default) one SUB socket per pool endpoint connects to
``tcp://<address>:<socketPort + rank>`` (engines bind: ``--kv-events-config`` endpoint
``tcp://*:<port>``); with ``zmqEndpoint`` one SUB socket binds there and engines connect to it
(endpoint ``tcp://<epp>:<port>``), each event then belongs to the endpoint named by its topic's
pod field (``kv@<pod>@<model>``: endpoint id, name, ``address:port``, or address with the
payload's data-parallel rank). Both can be on together.

Following the pool. As an extractor of ``endpoint-notification-source`` (upstream's samples) it
subscribes an added endpoint at once and unsubscribes a removed one, clearing its index entries;
from the first event on it stops polling the pool. Otherwise it compares its subscriptions with
the pool every 0.5 s. Publishers that send nothing for 30 s are reported (log, metrics; ``pool``):
routing goes on, their endpoints match no prefix.

Speculative indexing (``speculativeIndexing``): on PreRequest the request's keys are added for the
chosen endpoint for ``speculativeTTL``, so a burst of requests sharing a new prefix follows the
first one before the engine reports the blocks; the real ``BlockStored`` confirms them, the TTL
removes them otherwise. It hashes the whole prompt on the request path (a lookup only hashes up
to the first unknown block): with ``cbor-fnv`` that is ~40 µs per new block, so prefer ``xxh64``.

Parameters (YAML):

- ``tokenProcessorConfig``: ``blockSizeTokens`` (16; must equal the engine's block size, or
  divide it / be a multiple of it), ``blockSize`` (deprecated alias), ``hashSeed`` (""),
  ``hashAlgorithm`` (``cbor-fnv`` | ``xxh64``; ``xxh64`` is ~100x cheaper to compute here).
- ``indexerConfig.kvBlockIndexConfig``: ``inMemoryConfig`` {``size`` (max request keys, LRU;
  1e8), ``podCacheSize`` (max endpoints per key; 10)}, ``enableMetrics`` (false: the
  ``kv_cache_index_*`` metrics, see ``instrumented``), ``metricsLoggingInterval`` (0 = off;
  integer nanoseconds as upstream's ``time.Duration``, e.g. ``60000000000``, or a duration string
  such as ``1m``; at least 1 s): with ``enableMetrics``, log those metrics every interval.
- ``kvEventsConfig``: ``zmqEndpoint`` (""), ``topicFilter`` (``kv@``), ``concurrency`` (4),
  ``engineType`` (``vllm`` | ``sglang``), ``discoverPods`` (true), ``podDiscoveryConfig``
  {``podLabelSelector`` ("": every pool endpoint; ``k=v``, ``k!=v``, ``k``, ``!k`` terms, comma
  separated), ``podNamespace`` (""), ``socketPort`` (5557), ``replaySocketPort`` (0 = off; resync
  is not supported, a non-zero value fails startup)}.
- ``speculativeIndexing`` (false), ``speculativeTTL`` (``2s``).

Deviations from upstream: ``podLabelSelector`` defaults to every pool endpoint, because endpoints
here come from the pool (already selected), not from a Kubernetes pod watch; without an
``endpoint-notification-source`` upstream subscribes to no pod, this producer polls the pool;
``metricsLoggingInterval`` also takes a duration string.

Memory: bounded by ``size`` keys and the pool; ``dump_state`` reports entries, ``bytesPerBlock``
and the estimate. Metrics: ``llm_d_epp_precise_prefix_index_blocks``/``_index_bytes`` (gauges),
``llm_d_epp_kv_events_total{event}``, ``llm_d_epp_kv_events_skipped_total{reason}``,
``llm_d_epp_kv_events_dropped_total{reason}``, ``llm_d_epp_kv_events_lost_total`` (sequence
gaps), and upstream's KV-event health families ``llm_d_epp_kv_cache_events_*`` (messages, socket
errors and reconnections, queue depth and capacity, skipped stores and removals, removal dedup;
``health``), all labelled ``plugin_name``.

YAML::

    plugins:
      - type: token-producer
        parameters: {backend: vllm, modelName: meta-llama/Llama-3.1-8B-Instruct}
      - type: precise-prefix-cache-producer
        parameters:
          tokenProcessorConfig: {blockSizeTokens: 16, hashAlgorithm: xxh64}
          kvEventsConfig: {podDiscoveryConfig: {socketPort: 5557}}
          speculativeIndexing: true
      - type: prefix-cache-scorer
        parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
      - type: endpoint-notification-source
    dataLayer:
      sources:
        - pluginRef: endpoint-notification-source
          extractors: [{pluginRef: precise-prefix-cache-producer}]
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    PREFIX_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    EndpointEvent,
    EndpointEventType,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugin.units import parse_duration
from epp.plugins.producers.precise_prefix.events import EventBatch
from epp.plugins.producers.precise_prefix.health import EventHealth
from epp.plugins.producers.precise_prefix.ingest import EventApplier
from epp.plugins.producers.precise_prefix.instrumented import InstrumentedIndex, build_index
from epp.plugins.producers.precise_prefix.keys import Extra, KeyHasher
from epp.plugins.producers.precise_prefix.kvevents import KVEventHub, tcp_url
from epp.plugins.producers.precise_prefix.metrics import IndexMetrics
from epp.plugins.producers.precise_prefix.params import PreciseParams, parse_selector
from epp.plugins.producers.precise_prefix.pool import Membership, PodMap, PublisherWatch

TOKEN_PRODUCER: Final = "token-producer"
REFRESH_INTERVAL: Final = 0.5
"""Seconds between subscription/pool reconciliations (when not following notifications)."""
WATCH_EVERY: Final = 10
"""Housekeeping ticks between checks for silent publishers (5 s)."""
MIN_BEAT_INTERVAL: Final = 1.0
"""Shortest ``metricsLoggingInterval`` honoured (seconds): a log line, not a busy loop."""
RESOLVE_INTERVAL: Final = 0.1
"""Minimum seconds between rebuilds of the pod → endpoint map on an unknown topic pod."""
MAX_DUMPED_ENDPOINTS: Final = 100


@dataclass(frozen=True, slots=True)
class _Prompts:
    """What produce leaves for PreRequest: the chain roots and prompts it looked up."""

    roots: tuple[int, ...]
    prompts: tuple[bytes, ...]
    extras: tuple[list[Extra] | None, ...]


class PrecisePrefixCacheProducer(PluginBase):
    TYPE: ClassVar[str] = "precise-prefix-cache-producer"

    @dataclass(frozen=True)
    class Params(PreciseParams):
        """See the module docstring; the fields live on ``PreciseParams`` so that the deprecated
        ``precise-prefix-cache-scorer`` takes the same parameters."""

    params: PreciseParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p: PreciseParams = self.params
        self._log = handle.logger(self.typed_name)
        tp = p.token_processor_config
        if tp.block_size > 0:
            self._log.warning("tokenProcessorConfig.blockSize is deprecated; use blockSizeTokens")
        self.block_size = tp.effective_block_size
        self.hasher = KeyHasher(
            algorithm=tp.hash_algorithm, block_size=self.block_size, hash_seed=tp.hash_seed
        )
        self.index = build_index(
            p.indexer_config.kv_block_index_config, handle.registry, self.typed_name.name, self._log
        )
        self._metrics = IndexMetrics(handle.registry, self.typed_name.name)
        self.health = EventHealth(handle.registry, self.typed_name.name)
        self.applier = EventApplier(
            self.index, self.hasher, self._log, self._metrics.count, self.health
        )
        self._ttl = parse_duration(p.speculative_ttl)
        self._key = PREFIX_MATCH_INFO.key(self.typed_name.name)
        self._input_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self._state_key = f"{self.TYPE}:{self.typed_name.name}:prompts"
        self._selector = parse_selector(p.kv_events_config.pod_discovery_config.pod_label_selector)
        self._pod_map = PodMap()
        self.membership = Membership(self.reconcile, self._log)
        self.watch = PublisherWatch(handle.registry, self.typed_name.name, self._log)
        self.hub: KVEventHub | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped: dict[str, int] = {}
        self.lost = 0

    # ---- data producer ------------------------------------------------------------------------

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._input_key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.compute(request, endpoints)

    def compute(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, PrefixMatchInfo]:
        """Match the prompt against the index and publish the per-endpoint infos."""
        self.index.expire(self.handle.clock())
        prompt: TokenizedPrompt | None = request.attributes.get(self._input_key)
        size = self.block_size
        matches: dict[str, int] = {}
        total = 0
        if prompt is not None:
            state = self._prompts(request.target_model, prompt)
            request.attributes[self._state_key] = state
            for root, tokens, extras in zip(state.roots, state.prompts, state.extras, strict=True):
                total += self.hasher.block_count(tokens)
                found = self.index.match(self.hasher.iter_keys(root, tokens, extras))
                for ep, n in found.items():
                    matches[ep] = matches.get(ep, 0) + n
        none = PrefixMatchInfo(0, total, size)
        infos = {
            ep.id: PrefixMatchInfo(matches[ep.id], total, size) if ep.id in matches else none
            for ep in endpoints
        }
        request.attributes[self._key] = infos
        if self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("request %s: %d blocks, matches %s", request.request_id, total, matches)
        return infos

    def _prompts(self, model: str, prompt: TokenizedPrompt) -> _Prompts:
        root = self.hasher.model_root(model)
        # vLLM adds cache_salt to the extra keys of a prompt's first block only.
        salt: list[Extra] | None = [(prompt.cache_salt,)] if prompt.cache_salt else None
        n = len(prompt.prompts)
        return _Prompts((root,) * n, prompt.prompts, (salt,) * n)

    # ---- speculative indexing -------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        # the prompts' tokens are scratch for this hook only: they go, used or not
        state: _Prompts | None = request.attributes.pop(self._state_key, None)
        if not self.params.speculative_indexing:
            return
        primary = result.profile_results.get(result.primary_profile)
        if state is None or primary is None or not primary.targets:
            return
        target = primary.targets[0].id
        deadline = self.handle.clock() + self._ttl
        for root, tokens, extras in zip(state.roots, state.prompts, state.extras, strict=True):
            self.index.add_speculative(target, self.hasher.keys(root, tokens, extras), deadline)
        self._metrics.size(self.index)

    # ---- events -------------------------------------------------------------------------------

    def handle_batch(self, batch: EventBatch) -> None:
        """Apply one decoded message (the hub's handler; also usable directly)."""
        self.applier.apply(batch)
        self._metrics.size(self.index)
        self.watch.heard(batch.endpoint)

    def _drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        self._metrics.count("dropped", reason)

    def _gap(self, endpoint: str, missed: int) -> None:
        self.lost += missed
        self._metrics.count("lost", n=missed)

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.hub is not None:
            return
        cfg = self.params.kv_events_config
        self.hub = KVEventHub(
            handler=self.handle_batch,
            resolve=self.resolve,
            topic_filter=cfg.topic_filter,
            engine=cfg.engine_type,
            concurrency=cfg.concurrency,
            logger=self._log,
            on_drop=self._drop,
            on_gap=self._gap,
            health=self.health,
        )
        await self.hub.start()
        if cfg.zmq_endpoint:
            self.hub.bind(cfg.zmq_endpoint)
            self.watch.central_bound(self.handle.clock())
        self.reconcile()
        name = str(self.typed_name)
        self._tasks = [asyncio.create_task(self._housekeeping(), name=name)]
        index_cfg = self.params.indexer_config.kv_block_index_config
        if isinstance(self.index, InstrumentedIndex) and index_cfg.metrics_logging_seconds > 0:
            interval = max(index_cfg.metrics_logging_seconds, MIN_BEAT_INTERVAL)
            self._tasks.append(asyncio.create_task(self._beat(interval), name=f"{name} beat"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        hub, self.hub = self.hub, None
        if hub is not None:
            await hub.stop()

    async def _housekeeping(self) -> None:
        """Every 0.5 s: follow the pool when no notifications come, expire speculative entries;
        every ``WATCH_EVERY`` ticks: look for silent publishers."""
        tick = 0
        while True:
            await asyncio.sleep(REFRESH_INTERVAL)
            tick += 1
            try:
                if self.membership.members is None:
                    self.reconcile()
                elif self.index.expire(self.handle.clock()):
                    self._metrics.size(self.index)
                if tick % WATCH_EVERY == 0 and self.hub is not None:
                    quiet = self.hub.messages == 0
                    self.watch.check(
                        self.hub.targets(), self.handle.clock(), nothing_received=quiet
                    )
            except Exception:  # a bad endpoint must not end the subscriptions
                self._log.exception("reconciling KV-event subscriptions failed")

    async def _beat(self, interval: float) -> None:
        """Upstream's "metrics beat": the index metrics in one log line every ``interval``."""
        assert isinstance(self.index, InstrumentedIndex)
        while True:
            await asyncio.sleep(interval)
            fields = self.index.counters.beat()
            self._log.info("metrics beat %s", " ".join(f"{k}={v}" for k, v in fields.items()))

    # ---- following the pool ---------------------------------------------------------------------

    def extract_endpoint(self, event: EndpointEvent) -> None:
        """An event of ``endpoint-notification-source``: from the first one on the pool is
        followed by events (subscribe on add, unsubscribe and clear on remove), not polled."""
        if event.type is EndpointEventType.DELETE:
            cleared = self.index.clear_endpoint(event.endpoint.id)
            self.applier.forget((event.endpoint.id,))
            self._log.debug("endpoint %s left: %d keys cleared", event.endpoint.id, cleared)
        self.membership.follow(event)

    def _pool(self) -> Sequence[Endpoint]:
        members = self.membership.members
        return self.handle.endpoints() if members is None else tuple(members.values())

    def reconcile(self) -> None:
        """Follow the pool (as notified, else as polled): subscribe to new endpoints, drop those
        that left, expire speculative entries."""
        endpoints = self._pool()
        self._pod_map.build(endpoints, self.handle.clock())
        gone = self.index.retain({ep.id for ep in endpoints})
        if gone:
            self.applier.forget(gone)
            self._log.info("forgot %d endpoints that left the pool", len(gone))
        self.index.expire(self.handle.clock())
        self._metrics.size(self.index)
        if self.hub is not None and self.params.kv_events_config.discover_pods:
            self.hub.set_targets(self.targets(endpoints))

    def targets(self, endpoints: Sequence[Endpoint]) -> dict[str, str]:
        """Endpoint id → the publisher URL its subscriber connects to."""
        pd = self.params.kv_events_config.pod_discovery_config
        return {
            ep.id: tcp_url(ep.address, pd.socket_port + ep.rank)
            for ep in endpoints
            if self._selector(ep.labels)
            and (not pd.pod_namespace or ep.namespace == pd.pod_namespace)
        }

    def resolve(self, pod: str, rank: int | None) -> str | None:
        """The endpoint a central-socket topic's pod field names."""
        found = self._pod_map.lookup(pod, rank)
        now = self.handle.clock()
        if found is None and now - self._pod_map.built_at >= RESOLVE_INTERVAL:
            self._pod_map.build(self._pool(), now)
            found = self._pod_map.lookup(pod, rank)
        return found

    # ---- state --------------------------------------------------------------------------------

    def dump_state(self) -> Mapping[str, Any]:
        counts = self.index.block_counts()
        top = sorted(counts.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        hub = self.hub
        return {
            "blockSizeTokens": self.block_size,
            "hashAlgorithm": self.hasher.algorithm,
            "index": dict(self.index.summary()),
            "endpoints": [{"endpoint": ep, "blocks": b} for ep, b in top[:MAX_DUMPED_ENDPOINTS]],
            "totalEndpoints": len(counts),
            "events": dict(self.applier.applied),
            "skipped": dict(self.applier.skipped),
            "dropped": dict(self.dropped),
            "lostMessages": self.lost,
            "keyCache": {"hits": self.hasher.cache_hits, "misses": self.hasher.cache_misses},
            "subscriptions": {
                "pool": "polled" if self.membership.members is None else "notified",
                "targets": len(hub.targets()) if hub else 0,
                "subscribed": len(hub.subscribed) if hub else 0,
                "silent": list(self.watch.silent[:MAX_DUMPED_ENDPOINTS]),
                "bound": hub.bound_endpoint if hub else "",
                "messages": hub.messages if hub else 0,
            },
            "indexMetrics": (
                dict(self.index.counters.beat())
                if isinstance(self.index, InstrumentedIndex)
                else {}
            ),
        }
