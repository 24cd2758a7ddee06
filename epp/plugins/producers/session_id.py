"""``session-id-producer``: a request's session identifier, read from a header or a cookie.

It publishes ``SessionIDDataKey/<name>`` (``epp.plugin.SESSION_ID.key(name)``): a ``str``, for
affinity plugins to read without knowing how the session travelled on the wire, e.g.
``session-affinity-scorer`` with ``strategy: session_id`` and the source
``{attribute: SessionIDDataKey, producer: <name>}``. It is the default producer of that data type:
a consumer of ``SessionIDDataKey/session-id-producer`` that nothing produces gets one, created by
the loader with no parameters.

Per request:

- ``headerName`` set: the value of that request header (name matched lower-cased), stripped of
  surrounding whitespace;
- ``cookieName`` set: the value of that cookie in the ``Cookie`` request header (``name=value``
  pairs separated by ``;``; the first pair with the name wins; a value in double quotes is
  unwrapped), stripped.

An absent or empty value publishes nothing: consumers treat a missing attribute as "no session
preference". The producer keeps no state and never fails a request.

Parameters (at most one may be set; setting both fails start-up, as upstream):

- ``headerName`` (string): the request header holding the session identifier.
- ``cookieName`` (string): the cookie holding it.

Difference from upstream: upstream refuses to start when neither is set; here the producer then
reads header ``x-session-id`` (the default header source of the session-affinity plugins), so the
default producer the loader creates for a consumer works. Upstream's unmerged proposals
(``bodyField``, ``lruSize``, ``ttl``) are not parameters of the current producer, nor of this one.

YAML::

    plugins:
      - type: session-id-producer
        parameters:
          cookieName: llm-d-session
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    SESSION_ID,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    cookie_value,
)
from epp.plugin.session import COOKIE_HEADER

DEFAULT_HEADER: Final = "x-session-id"


class SessionIDProducer(PluginBase):
    TYPE: ClassVar[str] = "session-id-producer"

    @dataclass(frozen=True)
    class Params:
        header_name: str = ""
        cookie_name: str = ""

        def __post_init__(self) -> None:
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

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self.key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        session = self.session_id(request)
        if session:
            request.attributes[self.key] = session

    def session_id(self, request: InferenceRequest) -> str:
        """The request's session identifier, ``""`` when it carries none."""
        headers = request.headers
        if self.header:
            return headers.get(self.header, "").strip()
        return cookie_value(headers.get(COOKIE_HEADER, ""), self.cookie).strip()
