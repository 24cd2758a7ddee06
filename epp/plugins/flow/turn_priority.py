"""``turn-priority``: requests that continue an agent session already at work wait in a higher band.

Multi-turn agents issue one request per turn; if every turn queues behind fresh traffic, agents
that have already started take longest to finish. With flow control on, this plugin raises the
priority band of a *continuation turn*. The exact rule:

1. **Session key** of a request: the first non-empty header among ``additionalSessionHeaders``
   (in order), ``x-claude-code-session-id``, ``x-session-affinity``, ``session-id``,
   ``session_id`` (the agent-identity headers, spec §4.5). No such header: the ``agent-identity``
   request attribute, when an ``agent-identity`` plugin published one (it may know headers this
   plugin was not told about). Neither: no session.
2. A session is **live** at time ``t`` while one of its requests has been dispatched and is not
   done, and for ``sessionIdleTimeout`` after its last request finished.
3. A request is a **continuation** when (a) its session key names a live session, or (b) it is a
   Responses API request with a non-empty ``previous_response_id`` (a follow-up turn by
   construction; the EPP does not see response ids, so no liveness check applies). The first
   request of a session is not a continuation, so opening sessions never jumps the queue.
4. A continuation with priority ``p`` waits in band ``p + boost`` when ``p >= 0`` and in band
   ``min(p + boost, -1)`` when ``p < 0``: a sheddable request stays sheddable.

The request's own ``priority`` (metrics labels, admitters) is unchanged; only its flow-control
band moves. The plugin remembers at most ``maxSessions`` sessions, forgetting the least recently
active idle ones first; a session key longer than 1024 characters counts as no session, so the
memory it holds stays under ``maxSessions`` KB whatever clients send.

Parameters:

- ``boost`` (int, default 1, >= 0).
- ``sessionIdleTimeout`` (Go duration, default ``60s``, >= 0).
- ``additionalSessionHeaders`` (list of header names, default empty; matched lower-cased).
- ``maxSessions`` (int, default 10000, > 0).

YAML::

    featureGates: [flowControl]
    plugins:
      - type: turn-priority
        parameters: {boost: 5, sessionIdleTimeout: 2m, additionalSessionHeaders: [x-agent-run]}
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from epp.plugin import Handle, InferenceRequest, PluginBase, agent_identity
from epp.plugin.units import parse_duration

SESSION_HEADERS: Final = (
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
)
MAX_SESSION_KEY_CHARS: Final = 1024
"""A longer session key is ignored (as the session-affinity bindings cap their ids)."""


@dataclass(slots=True)
class _Session:
    in_flight: int = 0
    last_done: float = 0.0


class TurnPriority(PluginBase):
    TYPE: ClassVar[str] = "turn-priority"

    @dataclass(frozen=True)
    class Params:
        boost: int = 1
        session_idle_timeout: str = "60s"
        additional_session_headers: tuple[str, ...] = ()
        max_sessions: int = 10_000
        idle_seconds: float = field(init=False, default=60.0)

        def __post_init__(self) -> None:
            if self.boost < 0:
                raise ValueError(f"boost must be >= 0, got {self.boost}")
            if self.max_sessions <= 0:
                raise ValueError(f"maxSessions must be > 0, got {self.max_sessions}")
            seconds = parse_duration(self.session_idle_timeout)
            if seconds < 0:
                raise ValueError(
                    f"sessionIdleTimeout must be >= 0, got {self.session_idle_timeout!r}"
                )
            object.__setattr__(self, "idle_seconds", seconds)
            object.__setattr__(
                self,
                "additional_session_headers",
                tuple(h.lower() for h in self.additional_session_headers),
            )

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._headers = (*params.additional_session_headers, *SESSION_HEADERS)
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def session_key(self, request: InferenceRequest) -> str:
        for name in self._headers:
            value = request.headers.get(name, "")
            if value:
                return value if len(value) <= MAX_SESSION_KEY_CHARS else ""
        key = agent_identity(request)
        return key if len(key) <= MAX_SESSION_KEY_CHARS else ""

    def is_continuation(self, request: InferenceRequest, now: float) -> bool:
        key = self.session_key(request)
        if key and self._is_live(self._sessions.get(key), now):
            return True
        body = request.body
        payload = body.payload if body is not None else None
        return bool(
            body is not None
            and body.kind == "responses"
            and payload is not None
            and payload.get("previous_response_id")
        )

    def adjusted_priority(self, request: InferenceRequest, now: float) -> int:
        p = request.priority
        if not self.params.boost or not self.is_continuation(request, now):
            return p
        return p + self.params.boost if p >= 0 else min(p + self.params.boost, -1)

    def on_dispatch(self, request: InferenceRequest, now: float) -> None:
        key = self.session_key(request)
        if not key:
            return
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(in_flight=1)
            self._trim(now)
        else:
            session.in_flight += 1
            self._sessions.move_to_end(key)

    def on_done(self, request: InferenceRequest, now: float) -> None:
        key = self.session_key(request)
        session = self._sessions.get(key) if key else None
        if session is None:
            return
        session.in_flight = max(0, session.in_flight - 1)
        session.last_done = now
        self._sessions.move_to_end(key)

    def live_sessions(self, now: float) -> int:
        return sum(1 for s in self._sessions.values() if self._is_live(s, now))

    def _is_live(self, session: _Session | None, now: float) -> bool:
        if session is None:
            return False
        return session.in_flight > 0 or now - session.last_done <= self.params.idle_seconds

    def _trim(self, now: float) -> None:
        """Drop expired sessions from the cold end, then idle ones while over the cap."""
        over = len(self._sessions) - self.params.max_sessions
        for key in list(itertools.islice(self._sessions, max(over, 0) + 16)):
            session = self._sessions[key]
            if session.in_flight:
                continue
            if over > 0 or not self._is_live(session, now):
                del self._sessions[key]
                over -= 1
