"""``session-affinity-scorer`` (alpha, category Affinity): a session's requests prefer the endpoint
its earlier requests went to.

Score: the session's endpoint scores 1.0 when it is a candidate, every other candidate 0.0; a
request with no usable session scores 0.0 everywhere (no preference; the other scorers decide).
``session-affinity-filter`` applies the same rule as a hard pin.

Two strategies (``strategy``):

``encoded_endpoint_header`` (default, stateless). The session's endpoint travels with the client:
the request header ``encodedEndpointHeaderConfig.header`` (default ``x-session-token``) holds the
standard, padded base64 of the endpoint id. Endpoint ids are ``<namespace>/<pod>-rank-<rank>``
(one per data-parallel rank / target port; ``<namespace>/<name>`` under file discovery), so a
token names one rank, not just a pod. After scheduling, the response carries the token of the
endpoint this instance binds (see ``profileName``) in the same header, for the client to echo.

``session_id`` (stateful). The client sends an opaque session id, read from the first source of
``sessionIdConfig.sources`` that yields a non-empty value (stripped): ``{header: <name>}`` or
``{attribute: <data type>, producer: <name>}``, a request attribute another plugin published, e.g.
``{attribute: agent-identity}`` (``agent-identity`` plugin) or ``{attribute: SessionIDDataKey,
producer: session-id-producer}`` (``session-id-producer``, which reads a header, a cookie or a
body field). This instance keeps a binding session id → endpoint id in memory, at most 100,000
(least recently used evicted first); a ``session-id-producer`` with ``lruSize`` / ``ttl`` sets
that cap and the TTL for the sessions read from it (``SessionIDLimits``; an
``evictionTtlSeconds`` set here wins over its ``ttl``). An unbound session has no
preference; after scheduling it is bound to the endpoint picked for it. A bound session whose
endpoint is not a candidate has no preference either, and is rebound to the endpoint picked
instead. A binding unused for ``evictionTtlSeconds`` is forgotten (swept every
``evictionSweepSeconds``). Nothing is written back to the client.

Shared between EPP replicas (``epp.plugin.SharedState``, with a cross-replica syncer configured),
``session_id`` only: a session's requests may reach any replica, so each must know the session's
endpoint. (``encoded_endpoint_header`` needs nothing: the token travels with the client; this
strategy exports nothing and ignores facts.)

- ``export_facts()`` drains, one fact each, ``{"session": <id>, "endpoint": <endpoint id>,
  "age": <seconds since last use>}`` for the sessions bound or moved here since the last call,
  and for sessions reused here on the same endpoint whose last share is older than
  ``evictionTtlSeconds / 8`` (so a session active on one replica stays alive on the others, at
  one fact per session per TTL/8 rather than one per request). At most 4096 per call, oldest
  dropped first. Bindings applied from peers are never re-exported (no echo), with one
  exception: a peer's fact that loses a conflict (below) makes this replica export its own
  winning binding once, so the two converge within a sync round trip.
- ``apply_facts(facts, origin)``: the binding whose last use is the most recent wins (ties: the
  greater endpoint id, so every replica picks the same), whoever holds it: the endpoint that
  served a session's latest request holds its longest cached prefix. Older news (reordered or
  replayed facts) changes nothing, a duplicate at most dates the use later by the time between
  its two deliveries; a peer's more recent use refreshes the binding here; malformed facts and
  facts older than the TTL are ignored. A binding applied here lapses ``evictionTtlSeconds``
  after the peer's last use as measured at export: replicas share no clock, so time in transit
  (about one sync interval; more for a log replayed at startup) is not counted.
- Bounds and fairness: the same 100 000 cap, evicting the least recently used binding whoever
  learned it; a peer's binding is placed by its last use, so it never pushes out a binding used
  more recently here. Every replica holds the sessions of the whole pool.
- Staleness: a session bound or moved here asks for prompt sharing (``Handle.share_soon``), so
  the others know it a few milliseconds later (refreshes wait for the sync interval); a request
  arriving elsewhere before that has no preference, and if it lands on another endpoint, the
  later use wins everywhere (the session moves once).

A malformed or spoofed token never fails a request: a value that is not valid padded base64, is
longer than 1024 characters, or does not decode to the id of a candidate endpoint gives no
affinity, exactly as no token. The token is not authenticated (as upstream): a client may name any
endpoint, but only among the candidates its request already has.

Parameters:

- ``strategy`` (``encoded_endpoint_header`` | ``session_id``, default ``encoded_endpoint_header``).
  Only the block of the chosen strategy is read and validated.
- ``profileName`` (string, default empty): which profile's pick is bound and written back, e.g.
  ``prefill``; empty = the primary profile (the only one with a single profile).
- ``encodedEndpointHeaderConfig.header`` (string, default ``x-session-token``, matched
  lower-cased).
- ``encodedEndpointHeaderConfig.cookieName`` (string, default ``llm-d-session``; empty = off):
  also carry the token in this cookie. It is read when the header is absent, and set on the response
  (``Set-Cookie: <name>=<token>; Path=/; HttpOnly; SameSite=Lax``) unless the model server's
  response or another plugin already sets a cookie (one Set-Cookie per response; none is ever
  overwritten). A browser-like client that keeps cookies then sticks without echoing a header.
- ``sessionIdConfig.sources`` (list, default ``[{header: x-session-id}]``): each entry sets exactly
  one of ``header`` and ``attribute``; ``producer`` names the publisher of ``attribute``.
- ``sessionIdConfig.evictionTtlSeconds`` (number > 0, default 300; 0 = default).
- ``sessionIdConfig.evictionSweepSeconds`` (number > 0, default 10; 0 = default).

Differences from the llm-d-router snapshot read (``ebab687``), all deliberate: it writes no
cookie (llm-d-router issue 28); the ``llm-d-session`` cookie here follows what llm-d's session
affinity is moving to, and ``cookieName: ""`` turns it off; bindings are capped at 100 000 per
instance, the least recently used dropped first, and one past its TTL is not used even before the
sweep; the sweep runs after
scheduling instead of on a timer; ``{attribute: SessionIDDataKey}`` without ``producer`` reads the
default ``session-id-producer`` (upstream reads a key no producer writes), and ``SessionID`` is
accepted for ``SessionIDDataKey``.

YAML, a P/D pair (one instance per profile, each with its own header)::

    plugins:
      - name: session-affinity-decode
        type: session-affinity-scorer
      - name: session-affinity-prefill
        type: session-affinity-scorer
        parameters:
          profileName: prefill
          encodedEndpointHeaderConfig: {header: x-session-token-prefill}

YAML, server-side sessions keyed by a header, else by the agent's own session header::

    plugins:
      - type: agent-identity
      - type: session-affinity-scorer
        parameters:
          strategy: session_id
          sessionIdConfig:
            sources: [{header: x-session-id}, {attribute: agent-identity}]
            evictionTtlSeconds: 600
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from epp.plugin import (
    SESSION_ID,
    SESSION_ID_PRODUCER,
    SESSION_LIMITS,
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
    ScorerCategory,
    SessionLimits,
    Stability,
    cookie_value,
)
from epp.plugin.session import COOKIE_HEADER
from scorers._session_bindings import MAX_BINDINGS, SessionBindings

STRATEGY_HEADER: Final = "encoded_endpoint_header"
STRATEGY_SESSION_ID: Final = "session_id"
DEFAULT_TOKEN_HEADER: Final = "x-session-token"
DEFAULT_SESSION_HEADER: Final = "x-session-id"
DEFAULT_TTL_SECONDS: Final = 300.0
DEFAULT_SWEEP_SECONDS: Final = 10.0
MAX_TOKEN_LENGTH: Final = 1024
SET_COOKIE: Final = "set-cookie"
_SESSION_ID_TYPES: Final = frozenset({str(SESSION_ID), "SessionID"})


@dataclass(frozen=True)
class EncodedEndpointHeaderConfig:
    header: str = DEFAULT_TOKEN_HEADER
    cookie_name: str = "llm-d-session"


@dataclass(frozen=True)
class SessionIDSource:
    header: str = ""
    attribute: str = ""
    producer: str = ""


@dataclass(frozen=True)
class SessionIDConfig:
    sources: tuple[SessionIDSource, ...] = ()
    eviction_ttl_seconds: float = 0.0
    eviction_sweep_seconds: float = 0.0


def encode_token(endpoint_id: str) -> str:
    """The session token naming ``endpoint_id``: standard, padded base64 of its UTF-8 bytes."""
    return base64.b64encode(endpoint_id.encode()).decode("ascii")


def decode_token(token: str) -> str:
    """The endpoint id a token names, ``""`` for no token or a malformed one (never raises)."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return ""
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, ValueError):  # UnicodeDecodeError is a ValueError
        return ""


class SessionAffinityScorer(PluginBase):
    TYPE: ClassVar[str] = "session-affinity-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        strategy: str = STRATEGY_HEADER
        encoded_endpoint_header_config: EncodedEndpointHeaderConfig = field(
            default_factory=EncodedEndpointHeaderConfig
        )
        session_id_config: SessionIDConfig = field(default_factory=SessionIDConfig)
        profile_name: str = ""

        def __post_init__(self) -> None:
            if self.strategy not in (STRATEGY_HEADER, STRATEGY_SESSION_ID):
                raise ValueError(
                    f"strategy must be {STRATEGY_HEADER!r} or {STRATEGY_SESSION_ID!r}, "
                    f"got {self.strategy!r}"
                )
            if self.strategy == STRATEGY_SESSION_ID:
                _validate_session_id(self.session_id_config)

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        p = self.params
        self.stateful = p.strategy == STRATEGY_SESSION_ID
        header_cfg = p.encoded_endpoint_header_config
        self.header = header_cfg.header.strip().lower() or DEFAULT_TOKEN_HEADER
        self.cookie = header_cfg.cookie_name.strip()
        sid = p.session_id_config
        self.sources = sid.sources or (SessionIDSource(header=DEFAULT_SESSION_HEADER),)
        self.ttl = sid.eviction_ttl_seconds or DEFAULT_TTL_SECONDS
        self.sweep_every = sid.eviction_sweep_seconds or DEFAULT_SWEEP_SECONDS
        self._bindings = SessionBindings(self.ttl)
        self._limits: SessionLimits | None = None
        self._next_sweep = 0.0
        self._logger = handle.logger(self.typed_name)
        # Per-request scratch in request.attributes, private to this instance.
        self._target_key = f"session-affinity-target/{self.typed_name.name}"
        self._absent_key = f"session-affinity-absent/{self.typed_name.name}"

    # ---- Consumer -------------------------------------------------------------------------

    def consumes(self) -> frozenset[DataKey[Any]]:
        """The ``SessionIDDataKey`` attributes read (so the loader adds their producer)."""
        if not self.stateful:
            return frozenset()
        keys = (_attribute_key(s) for s in self.sources if s.attribute)
        return frozenset(key for key in keys if key.data_type == SESSION_ID)

    # ---- Scorer ---------------------------------------------------------------------------

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        scores = dict.fromkeys((e.id for e in endpoints), 0.0)
        target = self.choose(request, endpoints)
        if target is not None:
            scores[target.id] = 1.0
        return scores

    def choose(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Endpoint | None:
        """The session's endpoint among ``endpoints``, or ``None`` (no session, unknown or
        malformed token, unbound session, or its endpoint is not a candidate)."""
        if not endpoints:
            return None
        if not self.stateful:
            token = self.token(request)
            wanted = decode_token(token)
            if not wanted:
                if token:
                    self._logger.debug("ignoring malformed session token %.64r", token)
                return None
            return next((e for e in endpoints if e.id == wanted), None)
        session = self.session_id(request)
        wanted = self._bindings.get(session, self.handle.clock()) if session else ""
        if not wanted:
            return None
        target = next((e for e in endpoints if e.id == wanted), None)
        request.attributes[self._absent_key] = target is None
        return target

    def token(self, request: InferenceRequest) -> str:
        """The session token the request carries: the header, else the cookie (if configured)."""
        token = request.headers.get(self.header, "")
        if not token and self.cookie:
            token = cookie_value(request.headers.get(COOKIE_HEADER, ""), self.cookie)
        return token

    def session_id(self, request: InferenceRequest) -> str:
        """The first non-empty session id among the sources (``session_id`` strategy)."""
        for source in self.sources:
            if source.header:
                value: Any = request.headers.get(source.header.strip().lower(), "")
            else:
                key = _attribute_key(source)
                value = request.attributes.get(key)
                if key.data_type == SESSION_ID and self.stateful:
                    self._apply_limits(request.attributes.get(SESSION_LIMITS.key(key.producer)))
            if isinstance(value, str) and value.strip():
                return value.strip()
        return ""

    def _apply_limits(self, limits: Any) -> None:
        """Bound the bindings by the ``SessionLimits`` the session's producer published
        (``lruSize``, ``ttl`` of ``session-id-producer``); ``evictionTtlSeconds`` set here wins."""
        if not isinstance(limits, SessionLimits) or limits == self._limits:
            return
        self._limits = limits
        if not self.params.session_id_config.eviction_ttl_seconds and limits.ttl_seconds > 0:
            self.ttl = limits.ttl_seconds
        self._bindings.bound(self.ttl, limits.lru_size or MAX_BINDINGS)

    # ---- PreRequest, ResponseHeaders ------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        picked = self.picked(result)
        if picked is None:
            return
        if not self.stateful:
            request.attributes[self._target_key] = picked.id
            return
        session = self.session_id(request)
        if not session:
            return
        now = self.handle.clock()
        absent = request.attributes.get(self._absent_key) is True
        if self._bindings.commit(session, picked.id, now, absent=absent):
            self.handle.share_soon()  # new or moved: its next turn may reach another replica
        if now >= self._next_sweep:
            self._bindings.sweep(now)
            self._next_sweep = now + self.sweep_every

    def picked(self, result: SchedulingResult) -> Endpoint | None:
        """The first target of this instance's profile (``profileName``, else the primary), or
        ``None`` when that profile did not run or picked nothing."""
        profile = self.params.profile_name or result.primary_profile
        chosen = result.profile_results.get(profile)
        return chosen.targets[0] if chosen is not None and chosen.targets else None

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        endpoint_id = request.attributes.get(self._target_key)
        if not isinstance(endpoint_id, str) or not endpoint_id:
            return
        token = encode_token(endpoint_id)
        set_headers[self.header] = token
        if self.cookie and SET_COOKIE not in set_headers and SET_COOKIE not in response.headers:
            set_headers[SET_COOKIE] = f"{self.cookie}={token}; Path=/; HttpOnly; SameSite=Lax"

    # ---- SharedState ------------------------------------------------------------------------

    def export_facts(self) -> list[Any]:
        """``session_id``: the bindings made, moved or due for a refresh here since the last
        call (none under the stateless ``encoded_endpoint_header``)."""
        if not self.stateful:
            return []
        return self._bindings.export(self.handle.clock())

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        """``session_id``: merge another replica's bindings, the most recent use winning."""
        if self.stateful and facts:
            self._bindings.apply(facts, self.handle.clock())

    # ---- StateDumper ------------------------------------------------------------------------

    def dump_state(self) -> Mapping[str, Any]:
        if not self.stateful:
            return {"strategy": STRATEGY_HEADER, "header": self.header, "cookie": self.cookie}
        return {
            "strategy": STRATEGY_SESSION_ID,
            "bindings": len(self._bindings),
            "capacity": self._bindings.capacity,
            "ttlSeconds": self.ttl,
            "pendingExport": self._bindings.pending,
            "exportDropped": self._bindings.export_dropped,
        }


def _attribute_key(source: SessionIDSource) -> DataKey[Any]:
    """The request-attribute key an ``attribute`` source reads (``<attribute>/<producer>``)."""
    if source.attribute in _SESSION_ID_TYPES:
        return SESSION_ID.key(source.producer or SESSION_ID_PRODUCER)
    return DataKey(source.attribute, source.producer)


def _validate_session_id(config: SessionIDConfig) -> None:
    for i, source in enumerate(config.sources):
        if (source.header == "") == (source.attribute == ""):
            raise ValueError(
                f"sessionIdConfig.sources[{i}]: exactly one of header or attribute must be set"
            )
    if config.eviction_ttl_seconds < 0:
        raise ValueError(f"evictionTtlSeconds must be > 0, got {config.eviction_ttl_seconds}")
    if config.eviction_sweep_seconds < 0:
        raise ValueError(f"evictionSweepSeconds must be > 0, got {config.eviction_sweep_seconds}")
