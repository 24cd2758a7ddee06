"""Errors plugins raise and the framework maps to the wire.

``InferenceError`` is what a request-path failure becomes on the wire: an Envoy
``ImmediateResponse`` with the upstream status mapping and the body
``inference error: <Code> - <Msg>``. ``PluginError`` and its subclasses are startup errors.
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Iterable, Mapping


class ErrorCode(enum.Enum):
    """Upstream ``errcommon`` codes with their HTTP status."""

    BAD_REQUEST = ("BadRequest", 400)
    UNAUTHORIZED = ("Unauthorized", 401)
    FORBIDDEN = ("Forbidden", 403)
    NOT_FOUND = ("NotFound", 404)
    PRECONDITION_FAILED = ("PreconditionFailed", 412)
    PAYLOAD_TOO_LARGE = ("PayloadTooLarge", 413)
    RESOURCE_EXHAUSTED = ("ResourceExhausted", 429)
    INTERNAL = ("Internal", 500)
    SERVICE_UNAVAILABLE = ("ServiceUnavailable", 503)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def http_status(self) -> int:
        return self.value[1]


class DropReason:
    """Values of the ``x-llm-d-request-dropped-reason`` header."""

    SATURATED = "rejected-saturated"
    NO_ENDPOINTS = "rejected-no-endpoints"
    TTL_EXPIRED = "rejected-ttl-expired"
    CONTEXT_CANCELLED = "rejected-context-cancelled"
    SHUTTING_DOWN = "rejected-shutting-down"
    EVICTED = "evicted"
    EVICTED_QUEUE_PRESSURE = "evicted-queue-pressure"
    EVICTED_PRIORITY = "evicted-priority"


class InferenceError(Exception):
    """A request-path failure answered with an ImmediateResponse."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        drop_reason: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code.label} - {message}")
        self.code = code
        self.message = message
        self.drop_reason = drop_reason
        self.headers = dict(headers or {})

    @property
    def body(self) -> str:
        return f"inference error: {self.code.label} - {self.message}"


class PluginError(Exception):
    """Base of every startup-time plugin error."""


def close_names(name: str, names: Iterable[str]) -> list[str]:
    """The names a misspelt ``name`` most likely meant, closest first (at most three; none when
    nothing is close). Case, ``-`` and ``_`` are ignored: ``max_queue_depth`` finds
    ``maxQueueDepth``."""

    def plain(text: str) -> str:
        return text.lower().replace("-", "").replace("_", "")

    by_plain: dict[str, str] = {}
    for candidate in sorted(names):
        by_plain.setdefault(plain(candidate), candidate)
    close = difflib.get_close_matches(plain(name), list(by_plain), n=3, cutoff=0.6)
    return [by_plain[c] for c in close]


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """``"did you mean 'a' or 'b'?"``, or ``""`` when no name is close."""
    close = close_names(name, names)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


class UnknownPluginType(PluginError):
    """A config names a type no installed package registers: the message suggests the closest
    types rather than listing every one (``epp plugins list`` does that)."""

    def __init__(self, type_name: str, available: list[str]) -> None:
        hint = did_you_mean(type_name, available) or (
            f"none of the {len(available)} available types is close; `epp plugins list` lists them"
        )
        super().__init__(f"unknown plugin type {type_name!r}; {hint}")
        self.type_name = type_name
        self.available = sorted(available)


class DuplicatePluginType(PluginError):
    pass


class PluginLoadError(PluginError):
    pass


class PluginConfigError(PluginError):
    """Bad parameters: names the instance, its type and the field path."""

    def __init__(self, *, plugin: str, type_name: str, path: str, problem: str) -> None:
        where = f"parameters.{path}" if path else "parameters"
        super().__init__(f"plugin {plugin!r} (type {type_name!r}): {where}: {problem}")
        self.plugin = plugin
        self.type_name = type_name
        self.path = path
        self.problem = problem
