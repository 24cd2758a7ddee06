"""Value types shared by the framework and every plugin.

Everything a filter, scorer or picker sees is immutable: an ``Endpoint`` is a frozen snapshot of one
model-server endpoint (address, labels, last scraped ``Metrics``) taken when the request is
scheduled. Per-request data that producers compute (prefix match info, tokenized prompt, ...) lives
in ``InferenceRequest.attributes`` and ``CycleState``, never on the endpoint.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Final, NamedTuple, overload


@dataclass(frozen=True, slots=True)
class TypedName:
    """A plugin instance's identity: ``type`` is the registered type, ``name`` the config name."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.name}/{self.type}"


@dataclass(frozen=True, slots=True)
class Metrics:
    """Scraped model-server state. ``update_time`` is the clock reading of the last scrape that
    changed at least one value (``0.0`` = never scraped). Scorers use the values as they are;
    detectors that must fail closed compare ``update_time`` with ``CycleState.now``."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0
    active_models: frozenset[str] = frozenset()
    waiting_models: frozenset[str] = frozenset()
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    custom: Mapping[str, float] = field(default_factory=dict)
    update_time: float = 0.0
    attributes: Mapping[str, Any] = field(default_factory=dict)
    """Values extractors publish beyond the fields above, under the text of a ``DataKey``
    ``<attribute>/<producer>`` (``Topology/topology-extractor``, ``GPUUtilization/dcgm-extractor``);
    write and read them with ``epp.plugin.attributes`` (``with_attribute``,
    ``endpoint_attribute``). Values are immutable. An extractor derives the ``Metrics`` it returns
    from the one it was given, so keys it does not own survive; publishing an attribute leaves
    ``update_time`` alone."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One schedulable endpoint: a (pod, target port) pair.

    ``id`` is ``<namespace>/<pod>-rank-<rank>`` as upstream, stable across scrapes.
    """

    id: str
    name: str
    namespace: str
    address: str
    port: int
    rank: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics: Metrics | None = None
    node_address: str = ""
    """IP of the node hosting the pod (the pod's ``status.hostIP``), for node-level exporters
    such as a DCGM DaemonSet; ``""`` when discovery does not know it (file discovery)."""

    @property
    def hostport(self) -> str:
        """``ip:port``; IPv6 addresses are bracketed like Go's ``net.JoinHostPort``."""
        if ":" in self.address:
            return f"[{self.address}]:{self.port}"
        return f"{self.address}:{self.port}"


@dataclass(slots=True)
class RequestBody:
    """What a parser extracted from a request body.

    ``kind`` names the API: ``chat``, ``completions``, ``responses``, ``embeddings``,
    ``conversations``, ``images``, ``anthropic-messages``, ``anthropic-count-tokens``,
    ``vllm-generate``, ``sglang-generate`` or ``raw``. ``payload`` is the decoded JSON object
    (``None`` for raw bodies). For a body that is not JSON on the wire (gRPC), ``raw`` is what the
    client sent and ``payload`` the request as the API it carries would have it: a vLLM gRPC
    ``Generate`` is ``completions`` with ``prompt``, Vertex AI's ``HttpBody`` its JSON.

    The content lives until the request is routed. Once the routed body has gone to Envoy, the
    EPP calls ``release``: ``raw``, ``payload`` and ``token_ids`` are dropped and ``released``
    is set, while ``kind``, ``stream``, ``max_output_tokens`` and ``cache_salt`` stay. Response
    hooks therefore see no content; a plugin that needs something of the body after routing
    keeps that in its own request attribute at ``pre_request``. An agent's request can hold a
    200,000-token context, and thousands are in flight while their answers stream: keeping every
    body until its answer ends would cost gigabytes.
    """

    kind: str
    payload: dict[str, Any] | None
    raw: bytes
    stream: bool = False
    max_output_tokens: int | None = None
    cache_salt: str = ""
    token_ids: tuple[int, ...] | None = None
    released: bool = False

    def release(self) -> None:
        """Drop the content (``raw``, ``payload``, ``token_ids``); the scalars stay."""
        self.raw = b""
        self.payload = None
        self.token_ids = None
        self.released = True


@dataclass(slots=True)
class ParseResult:
    """A parser's answer: the client-facing model (``""`` when the API has none), the parsed body,
    and whether the response phase should be skipped (e.g. Anthropic ``count_tokens``)."""

    model: str
    body: RequestBody
    skip_response_processing: bool = False


@dataclass(slots=True)
class InferenceRequest:
    """One request being scheduled. Created by the server, read by plugins.

    ``attributes`` is per-request scratch that producers fill before scheduling (keys are the data
    keys of the producing plugins) and that PreRequest / response hooks may read afterwards.
    """

    request_id: str
    headers: Mapping[str, str]
    path: str = "/v1/completions"
    incoming_model: str = ""
    target_model: str = ""
    body: RequestBody | None = None
    objective: str = ""
    priority: int = 0
    fairness_id: str = "default-flow"
    size_bytes: int = 0
    received_at: float = 0.0
    attributes: dict[str, Any] = field(default_factory=dict)
    upstream_headers: dict[str, str] = field(default_factory=dict)
    """Headers to set on the request the model server receives (lower-case names). PreRequest
    plugins write them, e.g. ``x-prefiller-host-port`` for P/D; the EPP adds them to its reply
    to Envoy. A value a client sent for one of the EPP's own control headers
    (``epp.plugin.wire.OWNED_REQUEST_HEADERS``) is removed first, so a client cannot forge it;
    the destination headers are the EPP's and cannot be set here."""


@dataclass(slots=True)
class CycleState:
    """Per-scheduling-cycle context: the clock reading the cycle runs at, a random source (seeded
    in tests), and scratch space plugins of one cycle may share."""

    now: float
    rng: random.Random
    data: dict[str, Any] = field(default_factory=dict)


class ScoredEndpoint(NamedTuple):
    """A candidate and its weighted total score, as the picker gets it. Immutable. A named tuple
    rather than a frozen dataclass: the engine builds one per candidate per profile, and a tuple
    is built in C (``tuple.__new__``) at a third of a frozen dataclass's cost."""

    endpoint: Endpoint
    score: float


class ScoredCandidates(Sequence[ScoredEndpoint]):
    """The scored candidates the scheduler hands a picker: a read-only sequence of
    ``ScoredEndpoint`` kept as two aligned sequences, ``endpoints`` and their weighted totals
    ``scores`` (``scores[i]`` is the total of ``endpoints[i]``). An item is built when it is read,
    so a picker that needs only the scores (the best one, its ties) reads ``scores`` and builds
    no ``ScoredEndpoint`` at all; any other picker indexes or iterates it as any sequence. Neither
    sequence may be changed once it is given here."""

    __slots__ = ("endpoints", "scores")

    def __init__(self, endpoints: Sequence[Endpoint], scores: Sequence[float]) -> None:
        if len(endpoints) != len(scores):
            raise ValueError(f"{len(endpoints)} endpoints but {len(scores)} scores")
        self.endpoints = endpoints
        self.scores = scores

    def __len__(self) -> int:
        return len(self.scores)

    @overload
    def __getitem__(self, index: int) -> ScoredEndpoint: ...
    @overload
    def __getitem__(self, index: slice) -> ScoredCandidates: ...
    def __getitem__(self, index: int | slice) -> ScoredEndpoint | ScoredCandidates:
        if isinstance(index, slice):
            return ScoredCandidates(self.endpoints[index], self.scores[index])
        return ScoredEndpoint(self.endpoints[index], self.scores[index])

    def __iter__(self) -> Iterator[ScoredEndpoint]:
        # ScoredEndpoint(e, s) for each pair, built in C
        return map(
            tuple.__new__, repeat(ScoredEndpoint), zip(self.endpoints, self.scores, strict=True)
        )

    def __repr__(self) -> str:
        return f"ScoredCandidates({list(self)!r})"


@dataclass(frozen=True, slots=True)
class PickResult:
    """The picker's answer: targets in preference order (first = primary, rest = fallbacks), and
    the scored candidates it chose from (a tuple, or the ``ScoredCandidates`` it was given)."""

    targets: tuple[Endpoint, ...]
    scored: Sequence[ScoredEndpoint] = ()


@dataclass(frozen=True, slots=True)
class ProfileResult:
    targets: tuple[Endpoint, ...]
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SchedulingResult:
    profile_results: Mapping[str, ProfileResult]
    primary_profile: str

    @property
    def primary(self) -> ProfileResult:
        return self.profile_results[self.primary_profile]


class ScorerCategory(enum.Enum):
    AFFINITY = "Affinity"
    DISTRIBUTION = "Distribution"
    BALANCE = "Balance"


class TerminationCause(enum.Enum):
    NATURAL = "natural"
    CLIENT_DISCONNECT = "client-disconnect"
    EVICTED = "evicted"
    ERROR = "error"


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0

    def merge(self, other: Usage) -> None:
        """Upstream rule: a field is only overwritten when the new block reports it non-zero; the
        total is the reported one when prompt and completion are both known, else their sum."""
        if other.prompt_tokens:
            self.prompt_tokens = other.prompt_tokens
        if other.completion_tokens:
            self.completion_tokens = other.completion_tokens
        if other.cached_tokens:
            self.cached_tokens = other.cached_tokens
        if other.total_tokens and self.prompt_tokens and self.completion_tokens:
            self.total_tokens = other.total_tokens
        else:
            self.total_tokens = self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class ParsedResponse:
    """What a parser read from (part of) a response: usage, streamed events, and the id of a
    stored Responses API response (``""`` when the response has none)."""

    usage: Usage | None = None
    streamed_events: int = 0
    response_id: str = ""


@dataclass(slots=True)
class ResponseInfo:
    """What response hooks see: headers (lower-cased), served endpoint, usage so far, and the
    Responses API response id once the model server has sent it."""

    request_id: str
    headers: Mapping[str, str]
    served_endpoint: str = ""
    streaming: bool = False
    status: int = 200
    usage: Usage = field(default_factory=Usage)
    end_of_stream: bool = False
    termination_cause: TerminationCause | None = None
    dynamic_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    response_id: str = ""


class Stability(enum.Enum):
    ALPHA = "alpha"
    BETA = "beta"
    STABLE = "stable"


DEFAULT_FAIRNESS_ID: Final = "default-flow"
