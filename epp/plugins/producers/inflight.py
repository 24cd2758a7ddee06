"""``inflight-load-producer``: the load this EPP itself has put on each endpoint, right now.

Scraped queue lengths are up to one scrape interval old; every request scheduled inside that
window sees the same numbers and picks the same "least loaded" pod. The EPP, however, knows
exactly what it dispatched: this producer counts, per endpoint, the requests it has sent and that
have not completed, and their uncached prompt tokens.

- A request is counted on its primary target at PreRequest (after scheduling).
- Its tokens are released when the response starts (response headers: prefill is over); the
  request itself is released when the response completes, or when the stream ends for any other
  reason (client disconnect, error).
- Uncached prompt tokens = prompt tokens (from ``TokenizedPrompt/<tokenProducer>``) minus the
  tokens the chosen endpoint already caches (``PrefixCacheMatchInfo/<prefixProducer>``, when a
  prefix producer ran), plus, with ``addEstimatedOutputTokens``, ``min(outputRatio · prompt,
  maxEstimatedOutputTokens)``.

It publishes ``InFlightLoad/<name>``: ``Mapping[endpoint id, InFlightLoad(requests, tokens)]`` for
every candidate, read by ``active-request-scorer`` and ``token-load-scorer``.

Parameters: ``addEstimatedOutputTokens`` (false), ``outputRatio`` (1.5),
``maxEstimatedOutputTokens`` (0 = no cap), ``tokenProducerName`` (``token-producer``),
``prefixProducerName`` (``approx-prefix-cache-producer``).

YAML::

    - type: inflight-load-producer
      parameters: {addEstimatedOutputTokens: true, outputRatio: 1.5}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.inflight import INFLIGHT_LOAD, InFlightLoad
from epp.plugin.prefix import PREFIX_MATCH_INFO, TOKENIZED_PROMPT

_IDLE: Final = InFlightLoad(0, 0)


class InflightLoadProducer(PluginBase):
    TYPE: ClassVar[str] = "inflight-load-producer"

    @dataclass(frozen=True)
    class Params:
        add_estimated_output_tokens: bool = False
        output_ratio: float = 1.5
        max_estimated_output_tokens: int = 0
        token_producer_name: str = "token-producer"
        prefix_producer_name: str = "approx-prefix-cache-producer"

        def __post_init__(self) -> None:
            if self.output_ratio < 0:
                raise ValueError("outputRatio must be >= 0")
            if self.max_estimated_output_tokens < 0:
                raise ValueError("maxEstimatedOutputTokens must be >= 0")

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._key = INFLIGHT_LOAD.key(self.typed_name.name)
        self._tokens_key = TOKENIZED_PROMPT.key(params.token_producer_name)
        self._prefix_key = PREFIX_MATCH_INFO.key(params.prefix_producer_name)
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        # request id → (endpoint id, tokens still counted)
        self._open: dict[str, tuple[str, int]] = {}

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        req, tok = self._requests, self._tokens
        request.attributes[self._key] = {
            e.id: InFlightLoad(req.get(e.id, 0), tok.get(e.id, 0)) if e.id in req else _IDLE
            for e in endpoints
        }

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if not targets or request.request_id in self._open:
            return
        eid = targets[0].id
        tokens = self._uncached_tokens(request, eid)
        self._requests[eid] = self._requests.get(eid, 0) + 1
        self._tokens[eid] = self._tokens.get(eid, 0) + tokens
        self._open[request.request_id] = (eid, tokens)

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        entry = self._open.get(request.request_id)
        if entry is not None and entry[1]:
            eid, tokens = entry
            self._tokens[eid] = max(0, self._tokens.get(eid, 0) - tokens)
            self._open[request.request_id] = (eid, 0)

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        entry = self._open.pop(request.request_id, None)
        if entry is None:
            return
        eid, tokens = entry
        left = self._requests.get(eid, 0) - 1
        if left > 0:
            self._requests[eid] = left
            self._tokens[eid] = max(0, self._tokens.get(eid, 0) - tokens)
        else:
            self._requests.pop(eid, None)
            self._tokens.pop(eid, None)

    def dump_state(self) -> dict[str, Any]:
        return {
            "requests": dict(self._requests),
            "tokens": dict(self._tokens),
            "open": len(self._open),
        }

    def _uncached_tokens(self, request: InferenceRequest, endpoint_id: str) -> int:
        prompt = request.attributes.get(self._tokens_key)
        count = int(getattr(prompt, "token_count", 0))
        infos = request.attributes.get(self._prefix_key)
        info = infos.get(endpoint_id) if infos else None
        cached = info.match_blocks * info.block_size_tokens if info is not None else 0
        tokens = max(0, count - cached)
        if self.params.add_estimated_output_tokens:
            est = int(self.params.output_ratio * count)
            if self.params.max_estimated_output_tokens:
                est = min(est, self.params.max_estimated_output_tokens)
            tokens += est
        return tokens
