"""``precise-prefix-cache-scorer`` (deprecated): a ``precise-prefix-cache-producer`` and a
``prefix-cache-scorer`` in one plugin, as upstream's older configurations declare it.

It takes the producer's parameters (see ``precise-prefix-cache-producer``) and builds that
producer under its own name through ``Handle.create_plugin``, the path any plugin has to another
type; so it publishes ``PrefixCacheMatchInfo/<name>``, subscribes to KV events and, with
``speculativeIndexing``, indexes on PreRequest. It scores with ``prefix-cache-scorer``'s formula
and defaults (``matchLengthWeight`` 0, ``matchLengthScaleTokens`` 8192) reading that key. New
configurations declare the two plugins instead.

YAML::

    plugins:
      - type: precise-prefix-cache-scorer
        parameters:
          tokenProcessorConfig: {blockSizeTokens: 16}
          kvEventsConfig: {podDiscoveryConfig: {socketPort: 5557}}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: precise-prefix-cache-scorer
            weight: 3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from epp.plugin import (
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    SchedulingResult,
    ScorerCategory,
)
from scorers.prefix_cache import PrefixCacheScorer

PRODUCER_TYPE = "precise-prefix-cache-producer"


class PrecisePrefixCacheScorer(PluginBase):
    TYPE: ClassVar[str] = "precise-prefix-cache-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        """The producer's parameters, passed on to it as they are (it decodes them strictly)."""

        token_processor_config: Mapping[str, Any] | None = None
        indexer_config: Mapping[str, Any] | None = None
        kv_events_config: Mapping[str, Any] | None = None
        speculative_indexing: bool | None = None
        speculative_ttl: str | None = field(default=None, metadata={"yaml": "speculativeTTL"})

        def producer_parameters(self) -> dict[str, Any]:
            given = {
                "tokenProcessorConfig": self.token_processor_config,
                "indexerConfig": self.indexer_config,
                "kvEventsConfig": self.kv_events_config,
                "speculativeIndexing": self.speculative_indexing,
                "speculativeTTL": self.speculative_ttl,
            }
            return {key: value for key, value in given.items() if value is not None}

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        logger = handle.logger(self.typed_name)
        logger.warning(
            "%s is deprecated; declare precise-prefix-cache-producer and prefix-cache-scorer",
            self.TYPE,
        )
        self.producer = handle.create_plugin(
            PRODUCER_TYPE, self.typed_name.name, self.params.producer_parameters()
        )
        self.scorer = PrefixCacheScorer(
            name=self.typed_name.name,
            params=PrefixCacheScorer.Params(prefix_match_info_producer_name=self.typed_name.name),
            handle=handle,
        )

    # DataProducer, Consumer
    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset(self.producer.produces())

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset(self.producer.consumes())

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        await self.producer.produce(request, endpoints)

    # Scorer
    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        return self.scorer.score(cycle, request, endpoints)

    # PreRequest, Lifecycle, StateDumper
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.producer.pre_request(request, result)

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    def dump_state(self) -> Mapping[str, Any]:
        return dict(self.producer.dump_state())
