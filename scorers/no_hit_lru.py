"""``no-hit-lru-scorer``: spread cold requests over endpoints (category Distribution).

A request is *cold* when no endpoint reports a prefix-cache hit for it (no ``match_blocks > 0`` in
``request.attributes["PrefixCacheMatchInfo/<producer>"]``, or no such attribute). Cold requests
fill the cache with new blocks, so sending them to the endpoint that received a cold request
longest ago spreads cache growth evenly. Warm requests are left to the affinity scorers.

With ``N`` candidates (spec §4.2)::

    warm request:  every endpoint scores 0.5
    cold request:  N == 1 → 1.0
                   never-used endpoints first, in candidate order i = 0, 1, ...:
                       score = 1 - i / (N - 1)
                   then endpoints seen before, by LRU position p (0 = least recently used, among
                   every endpoint the LRU remembers), after the U never-used ones:
                       score = max(0, 1 - (U + p) / (N - 1))

After scheduling (PreRequest) a cold request moves the primary profile's first target, and the
``prefill`` profile's first target if any, to the most-recent end of the LRU. The LRU remembers at
most ``lruSize`` endpoints. Coldness is re-read from the attribute at that point, over every
endpoint the producer covered (the scorer itself may have seen a filtered subset).

It offers ``score_list`` (``ListScorer``): the same scores as a list in candidate order,
which the scheduler sums without lookups; ``score`` is that list keyed by id.

Parameters:

- ``lruSize`` (int, default 1024, ≥ 0; 0 = default): endpoints remembered.
- ``prefixMatchInfoProducerName`` (string, default ``approx-prefix-cache-producer``).
- ``prefixPluginType``, ``prefixPluginName`` (strings): deprecated, ignored.

YAML::

    plugins:
      - type: no-hit-lru-scorer
        parameters:
          lruSize: 2048
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: no-hit-lru-scorer
            weight: 1
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    PREFIX_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    SchedulingResult,
    ScorerCategory,
)

DEFAULT_LRU_SIZE: Final = 1024
DEFAULT_PRODUCER: Final = "approx-prefix-cache-producer"
PREFILL_PROFILE: Final = "prefill"
WARM_SCORE: Final = 0.5


class NoHitLRUScorer(PluginBase):
    TYPE: ClassVar[str] = "no-hit-lru-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        lru_size: int = DEFAULT_LRU_SIZE
        prefix_match_info_producer_name: str = DEFAULT_PRODUCER
        prefix_plugin_type: str = ""
        prefix_plugin_name: str = ""

        def __post_init__(self) -> None:
            if self.lru_size < 0:
                raise ValueError(f"lruSize must be >= 0, got {self.lru_size}")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        if p.prefix_plugin_type or p.prefix_plugin_name:
            handle.logger(self.typed_name).warning(
                "parameters prefixPluginType/prefixPluginName are deprecated and ignored"
            )
        self._key = PREFIX_MATCH_INFO.key(p.prefix_match_info_producer_name or DEFAULT_PRODUCER)
        self._capacity = p.lru_size or DEFAULT_LRU_SIZE
        # Endpoint ids that received cold requests, least recently first.
        self._lru: OrderedDict[str, None] = OrderedDict()

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
        n = len(endpoints)
        if not self._is_cold(request, endpoints):
            return [WARM_SCORE] * n
        if n == 1:
            return [1.0]
        position = {ep: i for i, ep in enumerate(self._lru)}
        positions = [position.get(ep.id) for ep in endpoints]
        offset = positions.count(None)  # never-used endpoints come first
        scores: list[float] = []
        rank = 0
        for p in positions:
            if p is None:
                scores.append(1.0 - rank / (n - 1))
                rank += 1
            else:
                scores.append(max(0.0, 1.0 - (offset + p) / (n - 1)))
        return scores

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if not self._is_cold(request, None):
            return
        for profile in (result.primary_profile, PREFILL_PROFILE):
            picked = result.profile_results.get(profile)
            if picked is not None and picked.targets:
                self._touch(picked.targets[0].id)

    def dump_state(self) -> Mapping[str, Any]:
        """Endpoints that received cold requests, least recently first."""
        return {"leastRecentlyUsedFirst": list(self._lru), "capacity": self._capacity}

    def _is_cold(self, request: InferenceRequest, endpoints: Sequence[Endpoint] | None) -> bool:
        """No hit on any of ``endpoints`` (``None`` = every endpoint the attribute covers)."""
        infos: Mapping[str, PrefixMatchInfo] | None = request.attributes.get(self._key)
        if not infos:
            return True
        if endpoints is None:
            return not any(info.match_blocks > 0 for info in infos.values())
        for ep in endpoints:
            info = infos.get(ep.id)
            if info is not None and info.match_blocks > 0:
                return False
        return True

    def _touch(self, endpoint_id: str) -> None:
        self._lru[endpoint_id] = None
        self._lru.move_to_end(endpoint_id)
        while len(self._lru) > self._capacity:
            self._lru.popitem(last=False)
