"""The plugin contract.

A plugin is a class registered under the ``epp.plugins`` entry-point group. It has a class
attribute ``TYPE`` (the type name used in YAML), a nested frozen dataclass ``Params`` (its YAML
``parameters``, camelCase in YAML, snake_case in Python) and is constructed as
``cls(name=..., params=..., handle=...)``. ``PluginBase`` does that plumbing.

Roles are ``typing.Protocol`` classes; the loader checks them once at startup with ``isinstance``
and slots the instance into every role it fills. Filters, scorers and pickers are synchronous and
pure. Only ``DataProducer.produce`` and ``Lifecycle`` hooks may do I/O.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from epp.plugin.errors import InferenceError
from epp.plugin.keys import DataKey
from epp.plugin.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ParsedResponse,
    ParseResult,
    PickResult,
    ProfileResult,
    RequestBody,
    ResponseInfo,
    SchedulingResult,
    ScoredEndpoint,
    ScorerCategory,
    Stability,
    TypedName,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


@dataclass(frozen=True)
class NoParams:
    """Parameters of a plugin that takes none."""


class Handle(Protocol):
    """What the framework gives a plugin at construction."""

    @property
    def registry(self) -> CollectorRegistry: ...

    def clock(self) -> float: ...

    def plugin(self, name: str) -> Any: ...

    def endpoints(self) -> Sequence[Endpoint]: ...

    def logger(self, typed_name: TypedName) -> logging.Logger: ...

    def share_soon(self) -> None:
        """The calling plugin (a ``SharedState``) has just recorded facts other replicas should
        have at once (a new binding, new prefix blocks): the sync engine publishes at once (under
        a burst, within 5 to 20 ms) instead of at its next interval. Cheap enough for
        the request path (a flag set); a no-op without a cross-replica syncer. Facts still travel
        only through ``export_facts``."""
        ...

    def create_plugin(
        self, type_name: str, name: str, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        """A new instance of the plugin type ``type_name``, built as the loader builds a configured
        one (strict ``parameters``, the stability gate). For plugins composed of others: the
        instance is the caller's; it is not registered, and the caller forwards its hooks."""
        ...


class PluginBase:
    """Convenience base: stores the typed name, params and handle."""

    TYPE: ClassVar[str] = ""
    STABILITY: ClassVar[Stability] = Stability.BETA
    Params: ClassVar[type[Any]] = NoParams

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        self.typed_name = TypedName(type=self.TYPE, name=name or self.TYPE)
        self.params = params
        self.handle = handle


@runtime_checkable
class Plugin(Protocol):
    typed_name: TypedName


@runtime_checkable
class Filter(Protocol):
    typed_name: TypedName

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    typed_name: TypedName
    category: ClassVar[ScorerCategory]

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]: ...


@runtime_checkable
class Picker(Protocol):
    typed_name: TypedName

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> PickResult: ...


@dataclass(frozen=True)
class Profile:
    """A scheduling profile as the framework runs it (built by the config loader)."""

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[tuple[Scorer, float], ...]
    picker: Picker


@runtime_checkable
class ProfileHandler(Protocol):
    typed_name: TypedName

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Profile],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, Profile]: ...

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult: ...


@runtime_checkable
class Decider(Protocol):
    """Decides per request whether a disaggregated stage (prefill or encode) runs, for the
    ``disagg-profile-handler`` (``deciders.prefill``, ``deciders.encode``). ``endpoint`` is the
    decode pick when decode ran first, ``None`` otherwise (``prefill-first`` order). Synchronous
    and pure over the request, like a filter; it reads only request attributes that producers
    published before scheduling. Upstream's ``deciderPlugin``."""

    typed_name: TypedName

    def disaggregate(
        self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None
    ) -> bool: ...


class ResponseState(Protocol):
    """Incremental usage extraction for one streamed response (SSE events may span chunks)."""

    def feed(self, chunk: bytes, end_of_stream: bool) -> ParsedResponse: ...


@runtime_checkable
class Parser(Protocol):
    """Request/response parser (``requestHandler.parsers``).

    ``claims`` are path suffixes; an empty tuple makes the parser the fallback.
    ``parse_request`` raises ``InferenceError`` (400) on bad input. Parsers whose
    ``supports_model_rewrite`` is true also implement ``rewrite_model``, which returns the body with
    ``model`` replaced (compact JSON, sorted keys, as upstream's Go marshal).
    """

    typed_name: TypedName
    supports_model_rewrite: ClassVar[bool]

    def claims(self) -> tuple[str, ...]: ...

    def parse_request(self, path: str, body: bytes, headers: Mapping[str, str]) -> ParseResult: ...

    def rewrite_model(self, body: RequestBody, target_model: str) -> bytes: ...

    def new_response_state(self, headers: Mapping[str, str] | None = None) -> ResponseState: ...

    def parse_response(
        self, chunk: bytes, headers: Mapping[str, str], *, streaming: bool, end_of_stream: bool
    ) -> ParsedResponse: ...


@runtime_checkable
class DataProducer(Protocol):
    """Fills ``request.attributes[key]`` for each key in ``produces()`` before scheduling, within
    its timeout (``ProducerTimeout``, else 400 ms). Producers run in data-dependency order."""

    typed_name: TypedName

    def produces(self) -> frozenset[DataKey[Any]]: ...

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class Consumer(Protocol):
    """Declares the request attribute keys a plugin needs; the loader finds producers for them."""

    typed_name: TypedName

    def consumes(self) -> frozenset[DataKey[Any]]: ...


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
class Admitter(Protocol):
    typed_name: TypedName

    def admit(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> InferenceError | None: ...


@runtime_checkable
class SaturationDetector(Protocol):
    typed_name: TypedName

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class PreRequest(Protocol):
    typed_name: TypedName

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseHeaders(Protocol):
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
    typed_name: TypedName

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None: ...


@runtime_checkable
class Lifecycle(Protocol):
    typed_name: TypedName

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class ReadinessChecker(Protocol):
    typed_name: TypedName

    def is_ready(self) -> bool: ...


@runtime_checkable
class StateDumper(Protocol):
    typed_name: TypedName

    def dump_state(self) -> Mapping[str, Any]: ...


# ---- data layer -----------------------------------------------------------------------------


@runtime_checkable
class DataSource(Protocol):
    """Polled per endpoint by the collector; returns the raw payload (e.g. /metrics text).
    Capabilities: ``PollInterval`` (poll less often), ``EndpointForgetter`` (drop state of an
    endpoint that left)."""

    typed_name: TypedName

    async def poll(self, endpoint: Endpoint) -> bytes: ...


@runtime_checkable
class Extractor(Protocol):
    """Turns a source payload into updated ``Metrics`` for one endpoint (pure). ``now`` is the
    scrape time to stamp as ``update_time`` when a value changed."""

    typed_name: TypedName

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics: ...


class EndpointEventType(enum.Enum):
    """What happened to an endpoint (upstream's ``EventAddOrUpdate`` / ``EventDelete``)."""

    ADD_OR_UPDATE = "add-or-update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class EndpointEvent:
    """An endpoint joined the pool or changed (address, port, labels; not metrics), or left it.
    A changed address is delivered as ``DELETE`` of the old endpoint then ``ADD_OR_UPDATE``."""

    type: EndpointEventType
    endpoint: Endpoint


@runtime_checkable
class EndpointSource(Protocol):
    """A ``dataLayer.sources`` entry driven by endpoint lifecycle changes instead of polling
    (``endpoint-notification-source``). The collector calls ``notify_endpoint`` once per event
    and passes what it returns to the source's extractors (``None`` = drop the event). Those
    extractors must be ``EndpointExtractor``s; the loader checks it."""

    typed_name: TypedName

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None: ...


@runtime_checkable
class EndpointExtractor(Protocol):
    """Hears endpoint lifecycle events from the ``EndpointSource`` it is listed under (upstream's
    ``EndpointExtractor``): e.g. subscribe to a pod's KV events when it is added, drop its state
    when it is removed. Called on the event loop, synchronously, as the collector sees the change:
    it must return quickly and never block (schedule I/O on the plugin's own task). An exception
    is logged and counted; other extractors still hear the event.

    It may return attributes to publish on the endpoint (keys as in ``Metrics.attributes``, e.g.
    ``topology-extractor``'s topology from the pod's labels): the collector keeps them for as
    long as the endpoint stays and merges them into its metrics whenever it has any.
    """

    typed_name: TypedName

    def extract_endpoint(self, event: EndpointEvent) -> Mapping[str, Any] | None: ...


@runtime_checkable
class Discovery(Protocol):
    """Owns the endpoint set. ``run`` calls ``publish`` with the full set whenever it changes and
    returns only when cancelled."""

    typed_name: TypedName

    async def run(self, publish: Callable[[Sequence[Endpoint]], None]) -> None: ...
