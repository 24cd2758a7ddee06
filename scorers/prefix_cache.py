"""``prefix-cache-scorer``: prefer endpoints that already cache the request's prefix (Affinity).

The scorer does no indexing itself: a data producer (by default ``approx-prefix-cache-producer``)
stores per-endpoint match info in ``request.attributes["PrefixCacheMatchInfo/<producer>"]`` as a
mapping from endpoint id to ``PrefixMatchInfo`` before scheduling. For each endpoint::

    ratio       = match_blocks / total_blocks
    lengthScore = min(1, match_blocks * block_size_tokens / matchLengthScaleTokens) ** 2
    score       = w * lengthScore + (1 - w) * ratio           # w = matchLengthWeight

With the default ``w = 0`` the score is the matched fraction of the prompt; raising ``w`` rewards
long absolute matches, which save more prefill work than a high ratio on a short prompt. A missing
attribute, an endpoint absent from it, or ``total_blocks == 0`` scores 0.

It offers ``score_list`` (``ListScorer``): the same scores as a list in candidate order,
which the scheduler sums without lookups; ``score`` is that list keyed by id.

Parameters:

- ``matchLengthWeight`` (float, default 0.0, in [0, 1]): weight of ``lengthScore``.
- ``matchLengthScaleTokens`` (int, default 8192, > 0): matched tokens at which ``lengthScore``
  saturates.
- ``prefixMatchInfoProducerName`` (string, default ``approx-prefix-cache-producer``): name of the
  producer whose match info is read.

YAML::

    plugins:
      - type: prefix-cache-scorer
        parameters:
          matchLengthWeight: 0.3
          matchLengthScaleTokens: 4096
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: prefix-cache-scorer
            weight: 3
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, ClassVar

from epp.plugin import (
    PREFIX_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    ScorerCategory,
)

_id = attrgetter("id")


class PrefixCacheScorer(PluginBase):
    TYPE: ClassVar[str] = "prefix-cache-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        match_length_weight: float = 0.0
        match_length_scale_tokens: int = 8192
        prefix_match_info_producer_name: str = "approx-prefix-cache-producer"

        def __post_init__(self) -> None:
            if not 0.0 <= self.match_length_weight <= 1.0:
                raise ValueError(
                    f"matchLengthWeight must be between 0.0 and 1.0, got {self.match_length_weight}"
                )
            if self.match_length_scale_tokens <= 0:
                raise ValueError(
                    f"matchLengthScaleTokens must be > 0, got {self.match_length_scale_tokens}"
                )
            if not self.prefix_match_info_producer_name:
                raise ValueError("prefixMatchInfoProducerName must not be empty")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._key = PREFIX_MATCH_INFO.key(self.params.prefix_match_info_producer_name)
        self._log = handle.logger(self.typed_name)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        scores = self.score_list(cycle, request, endpoints)
        return {e.id: s for e, s in zip(endpoints, scores, strict=True)}

    def score_list(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        """``score`` in candidate order (``ListScorer``)."""
        # A plain dict probe (what DataKey.get does, without the call): this runs per request.
        infos: Mapping[str, PrefixMatchInfo] | None = request.attributes.get(self._key)
        if infos is None:
            if self._log.isEnabledFor(logging.DEBUG):
                self._log.debug("request %s has no %s attribute", request.request_id, self._key)
            return [0.0] * len(endpoints)
        # Endpoints without a match share one info object (the producer's): score each distinct
        # object once, not once per endpoint.
        score_one = self._score_one
        last: PrefixMatchInfo | None = None
        score = 0.0  # the score of ``None``
        return [
            score if info is last else (score := score_one(last := info))
            for info in map(infos.get, map(_id, endpoints))
        ]

    def _score_one(self, info: PrefixMatchInfo | None) -> float:
        if info is None or info.total_blocks <= 0:
            return 0.0
        ratio = info.match_blocks / info.total_blocks
        matched_tokens = info.match_blocks * info.block_size_tokens
        length = min(1.0, matched_tokens / self.params.match_length_scale_tokens) ** 2
        weight = self.params.match_length_weight
        return min(1.0, max(0.0, weight * length + (1.0 - weight) * ratio))
