"""``mm-embeddings-cache-producer``: which endpoints recently encoded the request's images, videos
and audio, so ``mm-embeddings-cache-scorer`` can send the request where the encoder cache is warm.

Items. A request's media items are its chat ``image_url``, ``video_url``, ``audio_url`` and
``input_audio`` blocks and its Anthropic ``image`` blocks (also inside ``tool_result``). An item's
hash is ``xxh64`` of its URL (or base64 data; ``input_audio``: data then format) as lower-case
hex, the identity upstream's token producer gives media; the same item twice in a request counts
once, and every item has size 1. Requests without media get no attribute.

Cache. Per endpoint, an LRU of item hashes it was sent recently; it holds
``cacheSizeInMBPerServer MiB / 2 MiB`` items (2048 by default; the 2 MiB per item is upstream's
fixed assumption: size the budget like the model servers' encoder cache). Before scheduling the
producer publishes ``MultiModalEncoderCacheMatchInfoKey/<name>`` (``epp.plugin.multimodal``):
for every candidate an ``EncoderCacheMatchInfo(matched items, request items)`` (lookups do not
refresh recency). On PreRequest the items are added to the LRU of every target of the primary
profile. An endpoint's LRU is dropped when ``endpoint-notification-source`` reports it removed
(list this producer among its extractors) and, in any case, by a sweep every 2 minutes of
endpoints no longer in the pool (skipped while the pool is empty, as upstream).

Parameters:

- ``cacheSizeInMBPerServer`` (int, default 4096 MiB; ``<= 0`` = the default): the per-endpoint
  budget.
- ``cacheSizeInMB`` (int): the older name of the same budget, which upstream's sample config
  still uses; ``cacheSizeInMBPerServer`` wins when both are set and they must then agree.

Metrics (upstream's): ``llm_d_epp_encoder_cache_queries_total{plugin_type, plugin_name,
modality}`` (item lookups), ``llm_d_epp_encoder_cache_hits_total{plugin_type, plugin_name, pod,
modality}`` (lookups found in a pod's LRU, by pod; a removed pod's series are dropped) and the
histogram ``llm_d_epp_encoder_cache_hit_ratio{plugin_type, plugin_name}`` (matched / total items
per candidate).

Memory: at most (pool size) LRUs of the configured number of entries (~150 bytes each).

YAML::

    plugins:
      - type: endpoint-notification-source
      - type: mm-embeddings-cache-producer
        parameters: {cacheSizeInMBPerServer: 2048}
      - type: mm-embeddings-cache-scorer
    dataLayer:
      sources:
        - pluginRef: endpoint-notification-source
          extractors: [{pluginRef: mm-embeddings-cache-producer}]

Differences from upstream: upstream reads item hashes from ``TokenizedPrompt`` (its token
producer, with vLLM's hashes under the ``vllm`` backend) and so needs a ``token-producer``; here
``TokenizedPrompt`` carries no media, so items are read from the request body directly (the same
hashes as upstream's ``estimate`` backend, any backend), and no token producer is needed.
Upstream's strict decoding rejects ``cacheSizeInMB``; here it is an alias. Items with an empty
URL are skipped.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from prometheus_client import Counter, Histogram
from xxhash import xxh64_intdigest

from epp.plugin import (
    ENCODER_CACHE_MATCH_INFO,
    DataKey,
    EncoderCacheMatchInfo,
    Endpoint,
    EndpointEvent,
    EndpointEventType,
    Handle,
    InferenceRequest,
    MatchItem,
    PluginBase,
    RequestBody,
    SchedulingResult,
    Stability,
)
from epp.plugin.metrics import metric_family
from epp.plugin.multimodal import media_items

DEFAULT_CACHE_SIZE_MB: Final = 4096
BYTES_PER_ITEM: Final = 2 * 1024 * 1024
SWEEP_INTERVAL: Final = 120.0
MAX_DUMPED_PODS: Final = 100
MODALITIES: Final = ("image", "video", "audio")
_RATIO_BUCKETS: Final = tuple(i / 10 for i in range(11))


class MMEmbeddingsCacheProducer(PluginBase):
    TYPE: ClassVar[str] = "mm-embeddings-cache-producer"
    STABILITY: ClassVar[Stability] = Stability.BETA

    @dataclass(frozen=True)
    class Params:
        cache_size_in_mb_per_server: int = field(
            default=0, metadata={"yaml": "cacheSizeInMBPerServer"}
        )
        cache_size_in_mb: int = field(default=0, metadata={"yaml": "cacheSizeInMB"})

        def __post_init__(self) -> None:
            per_server, legacy = self.cache_size_in_mb_per_server, self.cache_size_in_mb
            if per_server > 0 and legacy > 0 and per_server != legacy:
                raise ValueError(
                    f"cacheSizeInMB ({legacy}) and cacheSizeInMBPerServer ({per_server}) "
                    "name the same budget and disagree; set cacheSizeInMBPerServer only"
                )

        @property
        def cache_size_mb(self) -> int:
            for value in (self.cache_size_in_mb_per_server, self.cache_size_in_mb):
                if value > 0:
                    return value
            return DEFAULT_CACHE_SIZE_MB

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._log = handle.logger(self.typed_name)
        if self.params.cache_size_in_mb > 0:
            self._log.warning(
                "cacheSizeInMB is the older name of cacheSizeInMBPerServer (upstream's EPP "
                "rejects it now); use cacheSizeInMBPerServer"
            )
        self.capacity = max(1, self.params.cache_size_mb * 1024 * 1024 // BYTES_PER_ITEM)
        """Items remembered per endpoint."""
        self.caches: dict[str, OrderedDict[str, None]] = {}
        self._key = ENCODER_CACHE_MATCH_INFO.key(self.typed_name.name)
        self._state_key = f"{self.TYPE}:{self.typed_name.name}:items"
        self._last_sweep = handle.clock()
        self._metrics = _Metrics(handle, self.TYPE, self.typed_name.name)

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.compute(request, endpoints)

    def compute(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, EncoderCacheMatchInfo] | None:
        """Publish the per-candidate match info (``None``, nothing published, without media)."""
        items = request_items(request.body)
        if not items:
            return None
        self._metrics.lookups(items, self.caches)
        infos = {}
        for ep in endpoints:
            cache = self.caches.get(ep.id)
            matched = tuple(i for i in items if i.hash in cache) if cache else ()
            self._metrics.ratio(len(matched) / len(items))
            infos[ep.id] = EncoderCacheMatchInfo(matched, items)
        request.attributes[self._key] = infos
        request.attributes[self._state_key] = items
        return infos

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self._maybe_sweep()
        items: tuple[MatchItem, ...] | None = request.attributes.get(self._state_key)
        primary = result.profile_results.get(result.primary_profile)
        if not items or primary is None:
            return
        for target in primary.targets:
            cache = self.caches.setdefault(target.id, OrderedDict())
            for item in items:
                cache[item.hash] = None
                cache.move_to_end(item.hash)
            while len(cache) > self.capacity:
                cache.popitem(last=False)

    def extract_endpoint(self, event: EndpointEvent) -> None:
        """``endpoint-notification-source``: a removed endpoint's cache goes at once."""
        if event.type is EndpointEventType.DELETE:
            self._drop(event.endpoint.id)

    def _drop(self, endpoint: str) -> None:
        if self.caches.pop(endpoint, None) is not None:
            self._log.debug("dropped the encoder cache of %s", endpoint)
        self._metrics.forget(endpoint)

    def _maybe_sweep(self) -> None:
        now = self.handle.clock()
        if now - self._last_sweep < SWEEP_INTERVAL:
            return
        self._last_sweep = now
        live = {ep.id for ep in self.handle.endpoints()}
        if live:
            for endpoint in [e for e in self.caches if e not in live]:
                self._drop(endpoint)

    def dump_state(self) -> Mapping[str, Any]:
        known = sorted(ep.id for ep in self.handle.endpoints())
        pods = sorted(((len(c), p) for p, c in self.caches.items()), key=lambda x: (-x[0], x[1]))
        return {
            "podList": known[:MAX_DUMPED_PODS],
            "totalKnownPods": len(known),
            "pods": [{"pod": p, "items": n} for n, p in pods[:MAX_DUMPED_PODS]],
            "totalPods": len(self.caches),
            "maxPods": MAX_DUMPED_PODS,
            "itemsPerPod": self.capacity,
        }


class _Metrics:
    """Upstream's encoder-cache metric families, shared by every instance on the registry."""

    def __init__(self, handle: Handle, type_name: str, name: str) -> None:
        reg, self._labels = handle.registry, (type_name, name)
        base = ("plugin_type", "plugin_name")
        self._queries = metric_family(
            reg,
            Counter,
            "llm_d_epp_encoder_cache_queries",
            "Total number of multimodal item hash lookups made against the encoder-cache "
            "affinity LRU.",
            (*base, "modality"),
        )
        self._hits = metric_family(
            reg,
            Counter,
            "llm_d_epp_encoder_cache_hits",
            "Total number of multimodal item hash lookups that found a match in the "
            "encoder-cache affinity LRU, by endpoint.",
            (*base, "pod", "modality"),
        )
        self._ratio = metric_family(
            reg,
            Histogram,
            "llm_d_epp_encoder_cache_hit_ratio",
            "Ratio of matched multimodal items to total items per endpoint in an encoder-cache "
            "lookup.",
            base,
            buckets=_RATIO_BUCKETS,
        ).labels(*self._labels)
        self._hit_series: dict[str, set[str]] = {}

    def lookups(self, items: Sequence[MatchItem], caches: Mapping[str, Mapping[str, None]]) -> None:
        for item in items:
            self._queries.labels(*self._labels, item.modality).inc()
            for pod, cache in caches.items():
                if item.hash in cache:
                    self._hits.labels(*self._labels, pod, item.modality).inc()
                    self._hit_series.setdefault(pod, set()).add(item.modality)

    def ratio(self, value: float) -> None:
        self._ratio.observe(value)

    def forget(self, pod: str) -> None:
        for modality in self._hit_series.pop(pod, ()):
            with contextlib.suppress(KeyError):
                self._hits.remove(*self._labels, pod, modality)


# ---- media items of a request body --------------------------------------------------------------


def request_items(body: RequestBody | None) -> tuple[MatchItem, ...]:
    """The distinct media items of a chat or Anthropic messages body, in order of appearance."""
    items: dict[str, MatchItem] = {}
    for modality, content in media_items(body):
        if content:
            digest = format(xxh64_intdigest(content.encode()), "x")
            items.setdefault(digest, MatchItem(digest, 1, modality))
    return tuple(items.values())
