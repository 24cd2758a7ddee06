"""Request control (llm-d's ``framework/interface/requestcontrol``): the hooks around
scheduling, in the order a request meets them. ``RequestHeaderProcessor`` when its headers
arrive; ``DataProducer`` before scheduling (the only hook that may await I/O, within its
timeout); ``Admitter`` after the producers (it may refuse the request); ``PreRequest`` once an
endpoint is picked; ``ResponseHeaders``, ``ResponseStreaming`` (each body chunk) and
``ResponseComplete`` on the way back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from epp.plugin.errors import InferenceError
from epp.plugin.keys import DataKey
from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ResponseInfo,
    SchedulingResult,
    TypedName,
)


@runtime_checkable
class RequestHeaderProcessor(Protocol):
    """Runs as soon as a request's headers arrive, before its body is read, before admission and
    scheduling (upstream's ``RequestHeaderProcessor``). It reads ``request.headers`` (lower-cased
    names; ``request.body`` is still ``None``) and may publish request attributes, e.g.
    ``epp.plugin.session.AGENT_IDENTITY``. Synchronous and cheap: it runs on every request.
    Processors run in configuration order; one that raises is logged and skipped, and the
    request goes on (upstream fails the request)."""

    typed_name: TypedName

    def request_header(self, request: InferenceRequest) -> None: ...


@runtime_checkable
class Screener(Protocol):
    """Narrows a request's candidates once, before its data producers, admitters and every
    scheduling profile run (upstream's request-control ``Screener``): a constraint no later
    filter, scorer or picker can undo, and one candidate set that all profiles of the request
    share (a disaggregated request's prefill and decode picks come from it).

    ``endpoints`` are the request's candidates (the routable pool, less the subset hint and what
    a ``CandidateNarrower`` excludes); ``screen`` returns those it keeps, a subset of them. Every
    screener is given the same candidates and the request keeps those that every screener kept
    (the intersection, in candidate order), so screeners do not depend on their order. When none
    is kept the request fails with 503 (``rejected-no-endpoints``): a screener fails closed by
    returning nothing. Synchronous and cheap, like a filter; a random choice draws from
    ``cycle.rng``. A screener is declared in ``plugins`` and runs for every request: it does not
    belong in a scheduling profile."""

    typed_name: TypedName

    def screen(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class DataProducer(Protocol):
    """Fills ``request.attributes[key]`` for each key in ``produces()`` before scheduling, within
    its timeout (``ProducerTimeout``, else 400 ms). Producers run in data-dependency order."""

    typed_name: TypedName

    def produces(self) -> frozenset[DataKey[Any]]: ...

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class Admitter(Protocol):
    typed_name: TypedName

    def admit(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> InferenceError | None: ...


@runtime_checkable
class PreRequest(Protocol):
    typed_name: TypedName

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseHeaders(Protocol):
    """Runs at the response's headers. Like every response hook, it sees the request without
    its content: the body was released once routed (``RequestBody.release``) and each
    ``TokenizedPrompt`` attribute keeps only its count (``TokenizedPrompt.count_only``); take
    what is needed of them in ``pre_request``."""

    typed_name: TypedName

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None: ...


@runtime_checkable
class ResponseStreaming(Protocol):
    """Runs on each response body chunk, after the response parser has read it (upstream's
    ``ResponseBodyProcessor``, extension point ``ResponseStreaming``): ``response`` holds what is
    known so far (usage, the Responses API ``response_id`` as soon as ``response.created``
    arrived) and ``end_of_stream`` on the last chunk. A non-streamed response, held to its end,
    gives one call. The chunk has not been forwarded to the client yet, so what a hook learns
    here is in place before the client can act on it. Only routed requests; hooks run in
    configuration order, synchronously on every chunk: keep them cheap. One that raises is
    logged and the stream goes on."""

    typed_name: TypedName

    def response_streaming(self, request: InferenceRequest, response: ResponseInfo) -> None: ...


@runtime_checkable
class ResponseComplete(Protocol):
    """Runs once when the request ends, whatever the cause; the request is without its content,
    as ``ResponseHeaders`` says."""

    typed_name: TypedName

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None: ...
