"""Optional capabilities: narrow Protocols a plugin may implement besides its roles.

A capability changes how the framework drives a plugin it already runs in a role. Each one is
detected once, when the configuration is loaded (or when the engine that owns the plugin is
built), with ``isinstance``; nothing on the request path asks a plugin what it can do.

- ``ProducerTimeout`` (``DataProducer``): its own budget instead of the default 400 ms.
- ``PollInterval`` (``DataSource``): polled every ``interval_seconds`` instead of every tick.
- ``EndpointForgetter`` (``DataSource``): told when an endpoint leaves, to drop its state.
- ``ReachabilityProbe`` (``DataSource``): its poll connects to the port the endpoint serves on,
  so a refused connection means the endpoint is down.
- ``ReservingDetector`` (``SaturationDetector``): flow control reserves and releases capacity.
- ``StaleEndpointCounter`` and ``ConfirmationGrace`` (``SaturationDetector``): how stale its
  inputs are, and how long freed capacity takes to show in its reading.
- ``AppProtocols`` (``Parser``): the InferencePool ``appProtocol`` values it can serve.
- ``CandidateNarrower`` (``SaturationDetector``): removes endpoints from the candidates of every
  request (the utilization detector's ``stalenessPolicy: exclude``).
- ``ListScorer`` (``Scorer``): its scores also as a list in candidate order, which the scheduler
  sums without a lookup per endpoint.
- ``ResponseBodyNeed`` (``ResponseStreaming``, ``ResponseComplete``): whether it needs a given
  response's body; when nothing needs a streamed body, the EPP stops taking its chunks.
- ``AttributeNeeds`` (a filter or scorer) and ``AttributePublisher`` (an extractor): endpoint
  attributes a plugin cannot work without, and the extractors that publish them; the loader
  refuses a config in which no source's extractor publishes one that is needed.

Typed data keys (``Consumer``, ``DataProducer``) are in ``epp.plugin.keys`` and
``epp.plugin.protocols``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from epp.plugin.types import CycleState, Endpoint, InferenceRequest, ResponseInfo

DEFAULT_PRODUCE_TIMEOUT = 0.4
"""Seconds a ``DataProducer`` without ``ProducerTimeout`` may take (upstream's default)."""

DEFAULT_CONFIRMATION_GRACE = 0.5
"""Seconds a detector without ``ConfirmationGrace`` is given: one 50 ms scrape tick, a 200 ms
staleness window and 250 ms for the engine to release the request's memory."""


@runtime_checkable
class ProducerTimeout(Protocol):
    """A ``DataProducer`` whose ``produce`` needs another budget (e.g. a remote tokenizer). A
    producer that overruns is cancelled and the request is scheduled without its data."""

    def produce_timeout(self) -> float: ...


@runtime_checkable
class ReachabilityProbe(Protocol):
    """A ``DataSource`` whose poll reaches the endpoint's serving port: when ``reaches_endpoint``
    is true, a poll failing with a refused connection (``ConnectionRefusedError``) takes the
    endpoint out of routing until a poll succeeds again (``epp.datalayer.store``)."""

    @property
    def reaches_endpoint(self) -> bool: ...


@runtime_checkable
class PollInterval(Protocol):
    """A ``DataSource`` polled every ``interval_seconds`` (rounded to a multiple of the
    collector's tick; ``0`` = every tick)."""

    @property
    def interval_seconds(self) -> float: ...


@runtime_checkable
class EndpointForgetter(Protocol):
    """A ``DataSource`` holding per-endpoint state (connections, subscriptions). ``forget`` is
    called once when an endpoint leaves the pool, and for the old address when an endpoint's
    address changes."""

    def forget(self, endpoint: Endpoint) -> None: ...


@runtime_checkable
class ReservingDetector(Protocol):
    """A ``SaturationDetector`` that counts requests itself. Flow control calls ``reserve`` when
    it dispatches a request (before its endpoint is known) and ``release`` when that request ends
    for any reason, so the reading accounts for a request from the moment it leaves the queue."""

    def reserve(self, request: InferenceRequest) -> None: ...

    def release(self, request: InferenceRequest) -> None: ...


@runtime_checkable
class StaleEndpointCounter(Protocol):
    """A ``SaturationDetector`` that reads scraped metrics: how many endpoints it currently
    treats as stale (exported as ``llm_d_epp_flow_control_stale_endpoints``)."""

    def stale_endpoints(self, now: float, endpoints: Sequence[Endpoint]) -> int: ...


@runtime_checkable
class ConfirmationGrace(Protocol):
    """Seconds between a request ending and its freed capacity showing in the detector's reading
    (flow control waits this long before it trusts a lower saturation)."""

    def confirmation_grace(self) -> float: ...


APP_PROTOCOL_HTTP = "http"
APP_PROTOCOL_H2C = "kubernetes.io/h2c"
"""The InferencePool ``spec.appProtocol`` values (GIE v1)."""


@runtime_checkable
class AppProtocols(Protocol):
    """A ``Parser`` that serves only some InferencePool ``appProtocol`` values (``http``,
    ``kubernetes.io/h2c``). In Kubernetes mode the EPP is not ready while the pool declares a
    protocol that a parser with a non-empty list does not name (spec §10); a parser without
    this capability, or with an empty list, puts no constraint on the pool."""

    def app_protocols(self) -> tuple[str, ...]: ...


@runtime_checkable
class CandidateNarrower(Protocol):
    """A ``SaturationDetector`` that takes endpoints out of routing: the Director schedules every
    request over ``routable(now, candidates)`` (after the subset hint). It must never return an
    empty list for a non-empty input."""

    def routable(self, now: float, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]: ...


@runtime_checkable
class ListScorer(Protocol):
    """A ``Scorer`` that also returns its scores as a sequence aligned with the candidates:
    ``score_list(...)[i]`` is the score of ``endpoints[i]``, exactly the value
    ``score(...)[endpoints[i].id]`` returns for the same call (0 where ``score`` leaves an
    endpoint out), one value per candidate. The scheduler then calls ``score_list`` instead of
    ``score`` and treats the values as it treats ``score``'s (clamped to [0, 1], NaN as 0, times
    the weight); a list of another length counts as the scorer failing (it contributes 0).
    ``score`` stays the role's method (the explain view, tests and other callers read it), so a
    scorer with this capability implements both; ``epp.plugin.testing.check_scorer`` checks
    that they agree. A scorer without it is summed from its mapping, unchanged."""

    def score_list(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[float]: ...


@runtime_checkable
class ResponseBodyNeed(Protocol):
    """A ``ResponseStreaming`` or ``ResponseComplete`` plugin that says, once per response, whether
    it needs that response's body. ``needs_response_body`` is called when the response headers
    arrive: ``response`` has the headers, status and served endpoint, not yet any usage or
    response id. ``False`` means the plugin does its job without this body.

    When no plugin needs a streamed (SSE) response's body, the model name is not rewritten, flow
    control is off and the response is not sampled for the response metrics
    (``--response-body-sample-ratio``), the EPP takes none of its chunks: a gateway that allows a
    processing-mode override is told not to send them, and one that sends them anyway gets each
    chunk back untouched. For such a response ``response_streaming`` is not called, and at
    ``response_complete`` the usage and the response id are unknown (zero, empty). Completion
    still comes exactly once, when the response ends. A plugin without this capability needs
    every body. Synchronous and cheap: it runs once per response; one that raises counts as
    needing the body."""

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool: ...


@runtime_checkable
class AttributeNeeds(Protocol):
    """A plugin that does nothing useful without some endpoint attributes (keys of
    ``Metrics.attributes``, e.g. ``epp.plugin.attributes.MULTICLUSTER_QUEUE_SIZE``) that only a
    particular extractor publishes (upstream's ``Consumes`` with ``Required`` endpoint keys). The
    loader refuses a config in which no extractor under ``dataLayer.sources`` is an
    ``AttributePublisher`` of each of them, naming the plugin and the attribute, rather than let
    the plugin score nothing in silence."""

    def required_attributes(self) -> frozenset[str]: ...


@runtime_checkable
class AttributePublisher(Protocol):
    """An ``Extractor`` or ``EndpointExtractor`` that names the endpoint attributes it publishes
    (the keys it writes with ``with_attribute``), for the loader's ``AttributeNeeds`` check."""

    def published_attributes(self) -> frozenset[str]: ...
