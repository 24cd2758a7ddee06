"""``mm-embeddings-cache-scorer``: prefer endpoints that likely hold the request's images, videos
and audio already encoded (Affinity).

It reads the per-endpoint ``EncoderCacheMatchInfo`` that ``mm-embeddings-cache-producer``
publishes at ``MultiModalEncoderCacheMatchInfoKey/<producer>`` (``epp.plugin.multimodal``) and
scores each endpoint::

    score = matchedItemSize / totalRequestItemSize

the sizes summed over the items (every item has size 1 today, so it is the fraction of the
request's distinct media items the endpoint is believed to have encoded). A request without
media (no attribute), an endpoint missing from it, or a total size of 0 scores 0. The scorer
keeps no state; when no producer of its key is configured the loader creates
``mm-embeddings-cache-producer`` with defaults, as upstream does.

Parameters:

- ``producerName`` (string, default "" = ``mm-embeddings-cache-producer``): the name of the
  producer whose match info is read.

YAML::

    plugins:
      - type: mm-embeddings-cache-producer
        parameters: {cacheSizeInMBPerServer: 2048}
      - type: mm-embeddings-cache-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: mm-embeddings-cache-scorer
            weight: 4

Differences from upstream: none.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import (
    ENCODER_CACHE_MATCH_INFO,
    MM_EMBEDDINGS_CACHE_PRODUCER,
    CycleState,
    DataKey,
    EncoderCacheMatchInfo,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
)


class MMEmbeddingsCacheScorer(PluginBase):
    TYPE: ClassVar[str] = "mm-embeddings-cache-scorer"
    STABILITY: ClassVar[Stability] = Stability.BETA
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        producer_name: str = ""

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        producer = self.params.producer_name or MM_EMBEDDINGS_CACHE_PRODUCER
        self._key = ENCODER_CACHE_MATCH_INFO.key(producer)
        self._log = handle.logger(self.typed_name)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        infos: Mapping[str, EncoderCacheMatchInfo] | None = request.attributes.get(self._key)
        if infos is None:
            if self._log.isEnabledFor(logging.DEBUG):
                self._log.debug("request %s has no %s attribute", request.request_id, self._key)
            return dict.fromkeys((ep.id for ep in endpoints), 0.0)
        return {ep.id: _score(infos.get(ep.id)) for ep in endpoints}


def _score(info: EncoderCacheMatchInfo | None) -> float:
    if info is None:
        return 0.0
    total = info.total_size
    if total <= 0:
        return 0.0
    return min(1.0, max(0.0, info.matched_size / total))
