"""``precise-prefix-cache-scorer`` (deprecated): a ``precise-prefix-cache-producer`` and a
``prefix-cache-scorer`` in one plugin, as upstream's older configurations declare it.

It takes the producer's parameters (see ``epp.plugins.producers.precise_prefix.producer``),
runs the producer under its own name (so it publishes ``PrefixCacheMatchInfo/<name>``,
subscribes to KV events and, with ``speculativeIndexing``, indexes on PreRequest) and scores
with ``prefix-cache-scorer``'s formula and defaults (``matchLengthWeight`` 0,
``matchLengthScaleTokens`` 8192) reading that key.
New configurations declare the two plugins instead.

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
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    SchedulingResult,
    ScorerCategory,
)
from epp.plugins.producers.precise_prefix.params import PreciseParams
from epp.plugins.producers.precise_prefix.producer import PrecisePrefixCacheProducer
from scorers.prefix_cache import PrefixCacheScorer


class PrecisePrefixCacheScorer(PluginBase):
    TYPE: ClassVar[str] = "precise-prefix-cache-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params(PreciseParams):
        """The producer's parameters (``PreciseParams``)."""

    params: PreciseParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        logger = handle.logger(self.typed_name)
        logger.warning(
            "%s is deprecated; declare precise-prefix-cache-producer and prefix-cache-scorer",
            self.TYPE,
        )
        self.producer = PrecisePrefixCacheProducer(
            name=self.typed_name.name, params=params, handle=handle
        )
        self.scorer = PrefixCacheScorer(
            name=self.typed_name.name,
            params=PrefixCacheScorer.Params(prefix_match_info_producer_name=self.typed_name.name),
            handle=handle,
        )

    # DataProducer, Consumer
    def produces(self) -> frozenset[str]:
        return self.producer.produces()

    def consumes(self) -> frozenset[str]:
        return self.producer.consumes()

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
        return self.producer.dump_state()
