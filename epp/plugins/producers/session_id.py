"""``session-id-producer``: a request's session identifier, from a header, a cookie or the body.

It publishes ``SessionIDDataKey/<name>`` (``epp.plugin.SESSION_ID.key(name)``): a ``str``, for
affinity plugins to read without knowing how the session travelled on the wire, e.g.
``session-affinity-scorer`` with ``strategy: session_id`` and the source
``{attribute: SessionIDDataKey, producer: <name>}``. It is the default producer of that data type:
a consumer of ``SessionIDDataKey/session-id-producer`` that nothing produces gets one, created by
the loader with no parameters.

Per request, the first non-empty of:

- ``headerName`` set: the value of that request header (name matched lower-cased), stripped of
  surrounding whitespace;
- ``cookieName`` set: the value of that cookie in the ``Cookie`` request header (``name=value``
  pairs separated by ``;``; the first pair with the name wins; a value in double quotes is
  unwrapped), stripped;
- ``bodyField`` set, when no header or cookie carried one: that field of the JSON request body,
  a top-level key or a dotted path into nested objects (``metadata.session_id``; a top-level key
  that contains the dot itself wins). A string (stripped) or an integer is taken; any other type,
  a value longer than 1024 characters, or a body that is not a JSON object gives nothing.

An absent or empty value publishes nothing: consumers treat a missing attribute as "no session
preference". The producer never fails a request.

With ``lruSize`` or ``ttl``, every published id comes with ``SessionIDLimits/<name>``
(``epp.plugin.SessionLimits``): the bounds of the session → endpoint memory that
``session-affinity-scorer`` and ``session-affinity-filter`` (``strategy: session_id``) keep for
the sessions read from this producer. ``lruSize`` caps the bindings they hold (the least recently
used forgotten first; default 100,000), ``ttl`` forgets a binding unused that long (default: the
consumer's ``evictionTtlSeconds``, 300 s; an ``evictionTtlSeconds`` set on the consumer wins).
The producer itself keeps no state.

Parameters:

- ``headerName`` (string): the request header holding the session identifier.
- ``cookieName`` (string): the cookie holding it. At most one of the two may be set; setting both
  fails start-up, as upstream.
- ``bodyField`` (string): the JSON body field holding it, when no header or cookie does.
- ``lruSize`` (int, ≥ 0, default 0 = the consumer's 100,000): sessions remembered at most.
- ``ttl`` (Go duration, ≥ 0, default ``""`` = the consumer's): idle time after which a session's
  binding is forgotten.

Difference from upstream: upstream refuses to start when neither ``headerName`` nor
``cookieName`` is set; here the producer then reads header ``x-session-id`` (the default header
source of the session-affinity plugins), so the default producer the loader creates for a consumer
works. ``bodyField``, ``lruSize`` and ``ttl`` were proposed for upstream's producer but are not in
the llm-d-router source read (``ebab687``); they follow that proposal's names.

YAML::

    plugins:
      - type: session-id-producer
        parameters:
          cookieName: llm-d-session
          bodyField: metadata.session_id
          lruSize: 50000
          ttl: 30m
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    SESSION_ID,
    SESSION_LIMITS,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    SessionLimits,
    cookie_value,
)
from epp.plugin.session import COOKIE_HEADER
from epp.plugin.units import parse_duration

DEFAULT_HEADER: Final = "x-session-id"
MAX_BODY_VALUE_LENGTH: Final = 1024
"""Longest session id taken from the body (a longer value gives none)."""
_TOO_MANY_DIGITS: Final = 10**MAX_BODY_VALUE_LENGTH


class SessionIDProducer(PluginBase):
    TYPE: ClassVar[str] = "session-id-producer"

    @dataclass(frozen=True)
    class Params:
        header_name: str = ""
        cookie_name: str = ""
        body_field: str = ""
        lru_size: int = 0
        ttl: str = ""

        def __post_init__(self) -> None:
            if self.lru_size < 0:
                raise ValueError(f"lruSize must be >= 0, got {self.lru_size}")
            if self.ttl and parse_duration(self.ttl) < 0:
                raise ValueError(f"ttl must not be negative, got {self.ttl!r}")
            object.__setattr__(self, "body_field", self.body_field.strip())
            header = self.header_name.strip().lower()
            cookie = self.cookie_name.strip()
            if header and cookie:
                raise ValueError(
                    "'session-id-producer' requires exactly one of headerName or cookieName "
                    "to be set, not both"
                )
            object.__setattr__(self, "header_name", header)
            object.__setattr__(self, "cookie_name", cookie)

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.key: DataKey[str] = SESSION_ID.key(self.typed_name.name)
        self.cookie = self.params.cookie_name
        self.header = "" if self.cookie else self.params.header_name or DEFAULT_HEADER
        field_name = self.params.body_field
        self.body_path = (field_name, *field_name.split(".")) if field_name else ()
        p = self.params
        ttl = parse_duration(p.ttl) if p.ttl else 0.0
        self.limits = SessionLimits(p.lru_size, ttl) if p.lru_size or ttl else None
        self.limits_key: DataKey[SessionLimits] = SESSION_LIMITS.key(self.typed_name.name)

    def produces(self) -> frozenset[DataKey[Any]]:
        if self.limits is None:
            return frozenset({self.key})
        return frozenset({self.key, self.limits_key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        session = self.session_id(request)
        if session:
            request.attributes[self.key] = session
            if self.limits is not None:
                request.attributes[self.limits_key] = self.limits

    def session_id(self, request: InferenceRequest) -> str:
        """The request's session identifier, ``""`` when it carries none."""
        headers = request.headers
        if self.header:
            session = headers.get(self.header, "").strip()
        else:
            session = cookie_value(headers.get(COOKIE_HEADER, ""), self.cookie).strip()
        if session or not self.body_path or request.body is None:
            return session
        return body_value(request.body.payload, self.body_path)


def body_value(payload: dict[str, Any] | None, path: tuple[str, ...]) -> str:
    """The session id at ``path`` (the field as written, then its dotted parts) of ``payload``."""
    if not isinstance(payload, dict):
        return ""
    value: Any = payload.get(path[0])
    if value is None and len(path) > 2:  # a dotted path: walk it
        value = payload
        for part in path[1:]:
            if not isinstance(value, dict):
                return ""
            value = value.get(part)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return ""
    if isinstance(value, int) and abs(value) >= _TOO_MANY_DIGITS:
        return ""
    text = str(value).strip()
    return text if len(text) <= MAX_BODY_VALUE_LENGTH else ""
