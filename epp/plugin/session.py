"""Session identity exchanged between plugins: the session id and the agent identity.

Two request attributes (per request, in ``InferenceRequest.attributes``), named as upstream so a
config that names them (``sessionIdConfig.sources[].attribute``) reads the same key here:

- ``SessionIDDataKey/<name>`` (``SESSION_ID.key(name)``): a ``str``, the session identifier a
  ``session-id-producer`` named ``name`` read from a header, a cookie or a body field. Its default
  producer is ``session-id-producer``: a consumer of ``SESSION_ID.key("session-id-producer")``
  that nobody produces gets one created by the loader.
- ``SessionIDLimits/<name>`` (``SESSION_LIMITS.key(name)``): a ``SessionLimits``, published beside
  the session id by a ``session-id-producer`` configured with ``lruSize`` or ``ttl``: the bounds
  of the session → endpoint memory that affinity plugins keep for the sessions it identifies.
- ``agent-identity/`` (``AGENT_IDENTITY``): a ``str``, the agent session a RequestHeader
  processor such as ``agent-identity`` resolved from agent-specific headers. The key carries no
  producer name (upstream's ``NewDataKey("agent-identity", "")``): any plugin that can tell an
  agent session apart may publish it. The Director uses it as the fairness id of a request that
  has no fairness header (spec §5.3 step 4).

``cookie_value`` is the one Cookie-header parser plugins share, so a cookie written by one plugin
and read by another is parsed the same way.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from epp.plugin.keys import DataKey, DataType
from epp.plugin.types import InferenceRequest

SESSION_ID: Final[DataType[str]] = DataType("SessionIDDataKey")
"""Data type of a request's session identifier (a ``str``)."""


class SessionLimits(NamedTuple):
    """Bounds of the session → endpoint memory for the sessions one producer identifies."""

    lru_size: int
    """Sessions remembered at most, the least recently used forgotten first (0: the consumer's
    default)."""
    ttl_seconds: float
    """A binding unused this long is forgotten (0: the consumer's default)."""


SESSION_LIMITS: Final[DataType[SessionLimits]] = DataType("SessionIDLimits")
"""Data type of the ``SessionLimits`` a session-id producer publishes beside the id."""

SESSION_ID_PRODUCER: Final = "session-id-producer"
"""Type (and default instance name) of the default ``SESSION_ID`` producer."""

AGENT_IDENTITY: Final[DataKey[str]] = DataType[str]("agent-identity").key("")
"""Where the agent identity of a request is published (``agent-identity/``)."""

COOKIE_HEADER: Final = "cookie"


def agent_identity(request: InferenceRequest) -> str:
    """The request's agent identity, or ``""`` when no processor published one."""
    value = request.attributes.get(AGENT_IDENTITY)
    return value if isinstance(value, str) else ""


def cookie_value(header: str, name: str) -> str:
    """The value of cookie ``name`` in a ``Cookie`` request header (``""`` when absent).

    Pairs are separated by ``;`` and split at their first ``=``; the first pair named ``name``
    wins; a pair without ``=`` is skipped. The value is stripped of surrounding whitespace and, when
    wrapped in double quotes (RFC 6265 §4.1.1 allows it), unwrapped. Nothing else is decoded.
    """
    if not header or not name:
        return ""
    for pair in header.split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                return value[1:-1]
            return value
    return ""
