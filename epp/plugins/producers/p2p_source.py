"""``p2p-source-producer`` (alpha): tell the computing pod which peer holds more of the prompt's
KV cache, so it can pull the blocks instead of recomputing them (upstream's plugin, same
parameters and header).

Before scheduling (``DataProducer``) it reads the prefix match of every candidate
(``PrefixCacheMatchInfo/<prefixMatchInfoProducerName>``, in tokens: matched blocks times the
block size) and keeps the best source: among the candidates whose cached tokens are within one
block of the largest, one chosen with weight ``1 / (1 + waiting queue)``, by the request id's
FNV-1a hash as the random draw (the same request always gets the same source; different requests
spread over equal peers), published as ``best-match/<name>``.

After scheduling (``PreRequest``) the computing pod is the first target of
``prefillProfileName`` when that profile picked one, else of the primary profile. When the source
is another pod and caches at least ``minCachedTokenDelta`` tokens more than the computing pod,
the request to the model server carries ``x-kv-cache-source-host-port: <ip:port>`` of the
source. A value the client sent for that header never reaches the pod (the EPP owns it).

Parameters: ``prefixMatchInfoProducerName`` (``""``: the default prefix producer,
``approx-prefix-cache-producer``), ``minCachedTokenDelta`` (1, at least 1), ``prefillProfileName``
(``prefill``).

YAML::

    plugins:
    - type: approx-prefix-cache-producer
    - type: p2p-source-producer
      parameters: {minCachedTokenDelta: 256}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, NamedTuple

from epp.plugin import (
    PREFIX_MATCH_INFO,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PrefixMatchInfo,
    SchedulingResult,
    Stability,
)

HEADER: Final = "x-kv-cache-source-host-port"
DEFAULT_PREFIX_PRODUCER: Final = "approx-prefix-cache-producer"
_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193


class Source(NamedTuple):
    """The chosen source: its ``ip:port`` and the prompt tokens it caches."""

    hostport: str
    cached_tokens: int


def spread_fraction(request_id: str) -> float:
    """FNV-1a (32-bit) of the request id over 2**32: upstream's draw in [0, 1)."""
    h = _FNV_OFFSET
    for byte in request_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h / 2**32


def cached_tokens(info: PrefixMatchInfo | None) -> int:
    return 0 if info is None else info.match_blocks * info.block_size_tokens


class P2PSourceProducer(PluginBase):
    TYPE: ClassVar[str] = "p2p-source-producer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        prefix_match_info_producer_name: str = ""
        min_cached_token_delta: int = 1
        prefill_profile_name: str = "prefill"

        def __post_init__(self) -> None:
            if self.min_cached_token_delta < 1:
                raise ValueError(
                    f"minCachedTokenDelta must be >= 1, got {self.min_cached_token_delta}"
                )

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        producer = params.prefix_match_info_producer_name or DEFAULT_PREFIX_PRODUCER
        self._match_key = PREFIX_MATCH_INFO.key(producer)
        self._prefill = params.prefill_profile_name or "prefill"  # upstream: empty means default
        self._best_key: DataKey[Source] = DataKey("best-match", self.typed_name.name)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._match_key})

    def produces(self) -> frozenset[DataKey[Any]]:
        """``best-match/<name>``: the chosen ``Source`` (upstream's request attribute), read by
        this plugin's PreRequest."""
        return frozenset({self._best_key})

    def _matches(self, request: InferenceRequest) -> Mapping[str, PrefixMatchInfo]:
        found = request.attributes.get(self._match_key)
        return found if isinstance(found, Mapping) else {}

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        request.attributes.pop(self._best_key, None)
        source = self.best_source(request, endpoints)
        if source is not None:
            request.attributes[self._best_key] = source

    def best_source(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Source | None:
        matches = self._matches(request)
        found: list[tuple[Endpoint, int, int]] = []
        for ep in endpoints:
            info = matches.get(ep.id)
            tokens = cached_tokens(info)
            if tokens and info is not None:
                found.append((ep, tokens, info.block_size_tokens))
        if not found:
            return None
        most = max(tokens for _, tokens, _ in found)
        near = [(ep, tokens) for ep, tokens, block in found if tokens + block >= most]
        weights = [1.0 / (1.0 + _waiting(ep)) for ep, _ in near]
        target = spread_fraction(request.request_id) * sum(weights)
        chosen = len(near) - 1
        for i, weight in enumerate(weights):
            if target < weight:
                chosen = i
                break
            target -= weight
        ep, tokens = near[chosen]
        return Source(ep.hostport, tokens)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        request.upstream_headers.pop(HEADER, None)
        source = request.attributes.get(self._best_key)
        if not isinstance(source, Source):
            return
        computing = result.primary
        prefill = result.profile_results.get(self._prefill)
        if prefill is not None and prefill.targets:
            computing = prefill
        if computing is None or not computing.targets:
            return
        endpoint = computing.targets[0]
        if source.hostport == endpoint.hostport:
            return
        held = cached_tokens(self._matches(request).get(endpoint.id))
        if source.cached_tokens - held >= self.params.min_cached_token_delta:
            request.upstream_headers[HEADER] = source.hostport


def _waiting(endpoint: Endpoint) -> int:
    metrics = endpoint.metrics
    return 0 if metrics is None else metrics.waiting_queue_size
