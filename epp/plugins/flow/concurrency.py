"""``concurrency-detector``: saturation from the EPP's own count of requests in flight.

The detector counts what the EPP itself has sent: a request is added to its endpoint when it is
scheduled (PreRequest, primary profile's first target) and removed when its response completes
(for any reason). With flow control on, the controller also *reserves* a request at dispatch
(``reserve``), before its endpoint is known, and ``done`` releases it; reserved requests count
toward the pool without an endpoint, so a burst dispatched in one instant is not invisible.
Tokens per request = the prompt size (``TokenizedPrompt`` when produced, else body bytes / 4).

Saturation over the candidates (``C = maxConcurrency``, ``T = maxTokenConcurrency``,
``n`` = number of endpoints, ``R``/``K`` = requests/tokens in flight on them plus reserved)::

    requests:  R / (n * C)
    tokens:    K / (n * T)
    hybrid:    mean over endpoints of max(r_e / C, k_e / T)   # reserved load spread evenly
    no endpoints: 1.0

As a filter it drops endpoints at their burst limit (``limit = int(capacity * (1 + headroom))``):
requests mode keeps ``r_e < limit_C``, tokens mode ``k_e < limit_T``, hybrid needs both. It may
drop every endpoint (the profile then fails with 429, as upstream).

Unlike ``utilization-detector`` it reacts at once to new traffic but is blind to the engines'
real state (KV-cache pressure, requests sent by others).

Parameters:

- ``concurrencyMode`` (``requests`` | ``tokens`` | ``hybrid``, default ``requests``).
- ``maxConcurrency`` (int, default 100, > 0): ideal requests in flight per endpoint.
- ``maxTokenConcurrency`` (int, default 1000000, > 0): ideal tokens in flight per endpoint.
- ``headroom`` (float, default 0.0, >= 0): burst allowance of the filter above the ideal.
- ``inFlightLoadProducerName`` (string): accepted for configuration compatibility; unused, the
  detector keeps its own count.

YAML::

    plugins:
      - type: concurrency-detector
        parameters: {concurrencyMode: hybrid, maxConcurrency: 64, headroom: 0.2}
    flowControl:
      saturationDetector: {pluginRef: concurrency-detector}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.flow import prompt_tokens


@dataclass(slots=True)
class _Held:
    request: InferenceRequest  # keeps the object (and so its id) alive while counted
    endpoint_id: str  # "" while only reserved
    tokens: int


class ConcurrencyDetector(PluginBase):
    TYPE: ClassVar[str] = "concurrency-detector"

    @dataclass(frozen=True)
    class Params:
        concurrency_mode: Literal["requests", "tokens", "hybrid"] = "requests"
        max_concurrency: int = 100
        max_token_concurrency: int = 1_000_000
        headroom: float = 0.0
        in_flight_load_producer_name: str = ""

        def __post_init__(self) -> None:
            if self.max_concurrency <= 0:
                raise ValueError(f"maxConcurrency must be > 0, got {self.max_concurrency}")
            if self.max_token_concurrency <= 0:
                raise ValueError(
                    f"maxTokenConcurrency must be > 0, got {self.max_token_concurrency}"
                )
            if self.headroom < 0.0:
                raise ValueError(f"headroom must be >= 0, got {self.headroom}")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        # Keyed by object identity: clients may reuse x-request-id values.
        self._held: dict[int, _Held] = {}
        self._load: dict[str, list[int]] = {}  # endpoint id -> [requests, tokens]
        self._reserved = [0, 0]  # requests, tokens not yet bound to an endpoint

    # ---- accounting ---------------------------------------------------------------------------

    def load(self, endpoint_id: str) -> tuple[int, int]:
        """(requests, tokens) in flight on one endpoint."""
        counts = self._load.get(endpoint_id)
        return (counts[0], counts[1]) if counts else (0, 0)

    @property
    def reserved(self) -> tuple[int, int]:
        return self._reserved[0], self._reserved[1]

    def reserve(self, request: InferenceRequest) -> None:
        if id(request) in self._held:
            return
        held = _Held(request, "", prompt_tokens(request))
        self._held[id(request)] = held
        self._reserved[0] += 1
        self._reserved[1] += held.tokens

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if not targets:
            return
        self.release(request)
        held = _Held(request, targets[0].id, prompt_tokens(request))
        self._held[id(request)] = held
        counts = self._load.setdefault(held.endpoint_id, [0, 0])
        counts[0] += 1
        counts[1] += held.tokens

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        """``ResponseBodyNeed``: only the response's end matters here."""
        return False

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        self.release(request)

    def release(self, request: InferenceRequest) -> None:
        """Forget a request (idempotent: completion and the flow controller may both call it)."""
        held = self._held.pop(id(request), None)
        if held is None:
            return
        if not held.endpoint_id:
            self._reserved[0] -= 1
            self._reserved[1] -= held.tokens
            return
        counts = self._load[held.endpoint_id]
        counts[0] -= 1
        counts[1] -= held.tokens
        if counts[0] <= 0:
            del self._load[held.endpoint_id]

    # ---- saturation detector ------------------------------------------------------------------

    def confirmation_grace(self) -> float:
        # Counts change the moment a request ends: no scrape to wait for.
        return 0.01

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float:
        n = len(endpoints)
        if not n:
            return 1.0
        p = self.params
        loads = [self.load(ep.id) for ep in endpoints]
        if p.concurrency_mode == "requests":
            return (sum(r for r, _ in loads) + self._reserved[0]) / (n * p.max_concurrency)
        if p.concurrency_mode == "tokens":
            return (sum(k for _, k in loads) + self._reserved[1]) / (n * p.max_token_concurrency)
        extra_r, extra_k = self._reserved[0] / n, self._reserved[1] / n
        return (
            sum(
                max((r + extra_r) / p.max_concurrency, (k + extra_k) / p.max_token_concurrency)
                for r, k in loads
            )
            / n
        )

    # ---- filter -------------------------------------------------------------------------------

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        p = self.params
        req_limit = int(p.max_concurrency * (1.0 + p.headroom))
        tok_limit = int(p.max_token_concurrency * (1.0 + p.headroom))
        kept = []
        for ep in endpoints:
            r, k = self.load(ep.id)
            if p.concurrency_mode == "requests":
                ok = r < req_limit
            elif p.concurrency_mode == "tokens":
                ok = k < tok_limit
            else:
                ok = r < req_limit and k < tok_limit
            if ok:
                kept.append(ep)
        return kept
