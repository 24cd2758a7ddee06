"""``session-affinity-filter`` (alpha): a hard pin of a session to the endpoint its earlier
requests went to.

When the session's endpoint is among the candidates, it is the only one kept; otherwise (no
session, an unbound session, a token that is malformed, spoofed or names an endpoint that left)
every candidate passes, so the filter never empties the list and never fails a request. Which
endpoint is "the session's" is decided exactly as by ``session-affinity-scorer``, with the same
parameters, defaults and strategies (see that module for the full reference):

- ``strategy: encoded_endpoint_header`` (default): the request header
  ``encodedEndpointHeaderConfig.header`` (default ``x-session-token``) holds the standard, padded
  base64 of the endpoint id ``<namespace>/<pod>-rank-<rank>``, so a token pins one
  data-parallel rank; the response carries the token of the endpoint picked (of ``profileName``'s
  profile, default the primary) for the client to echo. With
  ``encodedEndpointHeaderConfig.cookieName`` (ours, default off) the token also travels as a
  cookie (``Set-Cookie`` on the response, read when the header is absent).
- ``strategy: session_id``: an opaque session id from ``sessionIdConfig.sources`` (headers or
  request attributes such as ``agent-identity`` or ``SessionIDDataKey`` from
  ``session-id-producer``) is bound in memory to the endpoint it was routed to; bindings unused for
  ``sessionIdConfig.evictionTtlSeconds`` (300) are swept every ``evictionSweepSeconds`` (10); a
  session whose endpoint left the candidates is rebound to the endpoint picked instead.

A malformed or spoofed token never fails a request: it just gives no affinity (all candidates
pass). Parameters: ``strategy``, ``profileName``, ``encodedEndpointHeaderConfig.{header,
cookieName}``, ``sessionIdConfig.{sources, evictionTtlSeconds, evictionSweepSeconds}``, as for
the scorer; errors name this filter.

The filter builds a ``session-affinity-scorer`` under its own name through
``Handle.create_plugin`` and forwards its hooks (pre-request, response headers), so the two share
one implementation; the filter keeps its own bindings. It forwards ``export_facts`` and
``apply_facts`` too, so under ``session_id`` its bindings are shared between EPP replicas exactly
as the scorer's (see that module), under the filter's own name. Configure the filter or the
scorer for a session, not both: under ``session_id`` their bindings are independent and can
disagree.

YAML::

    plugins:
      - type: session-affinity-filter
        parameters:
          encodedEndpointHeaderConfig: {cookieName: llm-d-session}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: session-affinity-filter
          - pluginRef: queue-scorer
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    PluginConfigError,
    ResponseInfo,
    SchedulingResult,
    Stability,
)

SCORER_TYPE: Final = "session-affinity-scorer"


class SessionAffinityFilter(PluginBase):
    TYPE: ClassVar[str] = "session-affinity-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        """The scorer's parameters, passed on to it as they are (it decodes them strictly)."""

        strategy: str | None = None
        profile_name: str | None = None
        encoded_endpoint_header_config: Mapping[str, Any] | None = None
        session_id_config: Mapping[str, Any] | None = None

        def scorer_parameters(self) -> dict[str, Any]:
            given = {
                "strategy": self.strategy,
                "profileName": self.profile_name,
                "encodedEndpointHeaderConfig": self.encoded_endpoint_header_config,
                "sessionIdConfig": self.session_id_config,
            }
            return {key: value for key, value in given.items() if value is not None}

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        try:
            self.affinity = handle.create_plugin(
                SCORER_TYPE, self.typed_name.name, self.params.scorer_parameters()
            )
        except PluginConfigError as exc:  # re-raised as this filter's parameter error
            raise ValueError(f"{exc.path}: {exc.problem}" if exc.path else exc.problem) from None

    # Filter
    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        target = self.affinity.choose(request, endpoints)
        return endpoints if target is None else [target]

    # Consumer, PreRequest, ResponseHeaders, StateDumper: the composed scorer's
    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset(self.affinity.consumes())

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.affinity.pre_request(request, result)

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        self.affinity.response_headers(request, response, set_headers)

    def dump_state(self) -> Mapping[str, Any]:
        return dict(self.affinity.dump_state())

    # SharedState: the composed scorer's bindings (the scorer itself is not registered)
    def export_facts(self) -> list[Any]:
        return list(self.affinity.export_facts())

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        self.affinity.apply_facts(facts, origin)
