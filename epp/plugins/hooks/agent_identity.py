"""``agent-identity`` (alpha): which agent session a request belongs to, from the agent's headers.

A RequestHeader processor: when a request's headers arrive it publishes the first non-empty value
among these headers (matched lower-cased) as the request attribute ``agent-identity``
(``epp.plugin.AGENT_IDENTITY``):

1. each of ``additionalSessionHeaders``, in order;
2. ``x-claude-code-session-id`` (Claude Code);
3. ``x-session-affinity`` (OpenCode);
4. ``session-id`` (Codex 0.131 and later);
5. ``session_id`` (Codex 0.130, underscored).

No match: no attribute. The value is taken as sent (not trimmed), as upstream.

What uses it:

- The Director: a request without an ``x-llm-d-inference-fairness-id`` (or
  ``x-gateway-inference-fairness-id``) header gets the agent identity as its fairness id, so every
  turn of one agent session shares one flow-control queue; an explicit fairness header always
  wins; neither gives ``default-flow``.
- ``session-affinity-scorer`` / ``-filter`` with ``strategy: session_id`` and a source
  ``{attribute: agent-identity}`` pin an agent session to one endpoint.
- ``turn-priority`` falls back to it when none of its own headers is present.

A Responses API ``previous_response_id`` is not used (it names the previous turn, not the
session). The plugin keeps no state.

Parameters: ``additionalSessionHeaders`` (list of header names, default empty), checked before
the built-in list.

Differences from upstream: a processor that raises does not fail the request (it is logged and
the request goes on); and processors run when the request headers arrive, before the body is read
(upstream runs them after parsing the body; this one reads only headers, so it sees the same).

YAML::

    plugins:
      - type: agent-identity
        parameters:
          additionalSessionHeaders: [x-my-agent-session]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import AGENT_IDENTITY, Handle, InferenceRequest, PluginBase, Stability

SESSION_HEADERS: Final = (
    "x-claude-code-session-id",
    "x-session-affinity",
    "session-id",
    "session_id",
)
"""The built-in agent session headers, highest priority first."""


class AgentIdentity(PluginBase):
    TYPE: ClassVar[str] = "agent-identity"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        additional_session_headers: tuple[str, ...] = ()

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        extra = tuple(h.lower() for h in self.params.additional_session_headers)
        self.headers: tuple[str, ...] = (*extra, *SESSION_HEADERS)

    def request_header(self, request: InferenceRequest) -> None:
        headers = request.headers
        for name in self.headers:
            value = headers.get(name)
            if value:
                request.attributes[AGENT_IDENTITY] = value
                return
