"""``kv-headroom-filter``: keep the endpoints whose KV cache can still take this request, so that
routing never pushes a model server into preemption. Our own type, beyond upstream.

A vLLM server admits a request while its KV blocks last; once running requests need more blocks
than it has (each decode step takes one more token of KV), it preempts the most recent one and
computes it again later (``vllm:num_preemptions_total``). Affinity routing keeps sending a
session to the pod that caches it; when those sessions outgrow that pod, the pod thrashes while
others have room. This filter bounds what this EPP sends to each pod by the KV the pod has:

    need(request)  = prompt tokens + max output tokens (the request's own limit, else
                     ``defaultOutputTokens``)
    demand(ep)     = max(kv_now(ep) * capacity(ep), in_flight(ep))          # tokens
    fits(ep)       = demand(ep) + need(request) <= maxUsage * capacity(ep)

``capacity`` is ``cache_num_blocks * cache_block_size`` from the server's ``cache_config_info``;
``kv_now`` the scraped ``kv_cache_usage_percent`` corrected by what this EPP dispatched and saw
complete since the scrape; ``in_flight`` the ``need`` of this EPP's requests there that have not
completed, whether the server runs them already or still queues them (a queued request holds no
KV yet and is missing from the scrape, but will hold it): ``epp.plugin.kvusage``. Requests are
recorded at PreRequest (the primary profile's first target) and released at ResponseComplete.

An endpoint without metrics or without a KV size cannot be judged and is kept. When no endpoint
fits, the endpoints with the most room left (``capacity * maxUsage - demand``, in tokens) are
kept, so the filter alone never fails a request: the pool is full, and it is flow control's part
to hold requests back before that (``utilization-detector`` reads the same demand).

Shared prefixes are counted once per request, so ``in_flight`` overstates what the server holds
when several of this EPP's requests there share a prefix: the filter errs on the side of room.

Parameters:

- ``maxUsage`` (float, default 0.95, in (0, 1]): the share of a pod's KV this EPP fills at most.
- ``defaultOutputTokens`` (int, default 0, >= 0): output tokens counted for a request that sets
  no limit.

YAML::

    plugins:
      - type: kv-headroom-filter
        parameters: {maxUsage: 0.9}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: kv-headroom-filter
          - pluginRef: prefix-cache-scorer
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.kvusage import KVTracker, request_kv_tokens

TOKEN_PRODUCER: Final = "token-producer"


class KVHeadroomFilter(PluginBase):
    TYPE: ClassVar[str] = "kv-headroom-filter"

    @dataclass(frozen=True)
    class Params:
        max_usage: float = 0.95
        default_output_tokens: int = 0

        def __post_init__(self) -> None:
            if not 0.0 < self.max_usage <= 1.0:
                raise ValueError(f"maxUsage must be in (0, 1], got {self.max_usage}")
            if self.default_output_tokens < 0:
                raise ValueError(
                    f"defaultOutputTokens must be >= 0, got {self.default_output_tokens}"
                )

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._tokens_key = TOKENIZED_PROMPT.key(TOKEN_PRODUCER)
        self.tracker = KVTracker()

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._tokens_key})

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        if not endpoints:
            return endpoints
        need = request_kv_tokens(request, self.params.default_output_tokens)
        room = self.tracker.rooms(endpoints, cycle.now, self.params.max_usage)
        kept = [ep for ep, r in zip(endpoints, room, strict=True) if r is None or r >= need]
        if len(kept) == len(endpoints):
            return endpoints
        if kept:
            return kept
        best = max(r for r in room if r is not None)
        return [ep for ep, r in zip(endpoints, room, strict=True) if r == best]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if targets:
            need = request_kv_tokens(request, self.params.default_output_tokens)
            self.tracker.dispatch(request.request_id, targets[0].id, self.handle.clock(), need)

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        return False  # ResponseBodyNeed: without usage, the prompt's tokens are released

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        usage = response.usage
        held = usage.prompt_tokens + usage.completion_tokens if usage.prompt_tokens else 0
        self.tracker.complete(request.request_id, self.handle.clock(), held)
