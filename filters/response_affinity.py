"""``response-affinity-filter``: a Responses API follow-up goes to the server holding its previous
response. Our own type, beyond upstream (whose EPP ignores ``previous_response_id``).

A model server keeps Responses API state, the stored response and its conversation, in its own
memory (vLLM does, and so does ``epp sim``): a request naming ``previous_response_id`` gets 404
``response_not_found`` from any other server. Routed like any other request, such a follow-up
reaches the right one of four pods about one time in four.

Learning: when a routed request's response completes with a 2xx status and carries a response id
(the JSON ``id`` of a stored response, or ``response.id`` of the streamed ``response.created`` /
``response.completed`` events, read by the parser), the id is bound to the endpoint that served
it: the served endpoint Envoy reports when it is known, else the request's primary target.

Routing, for a request whose body names ``previous_response_id``:

- bound endpoint among the candidates → only that endpoint (``hit``). A hard pin: any other
  server would answer 404.
- bound endpoint no longer in the pool → every candidate (``pod_gone``); the follow-up fails
  upstream wherever it goes, and the metric says why.
- bound endpoint in the pool but not a candidate (an earlier filter or the subset hint removed
  it) → every candidate (``not_candidate``).
- unknown id → every candidate (``miss``).

Requests that name no previous response pass untouched (one dict probe).

Bounds: at most ``maxEntries`` bindings, least recently used evicted first; a binding lapses
``ttl`` after it was last bound or used. About 200 bytes per binding.

Parameters:

- ``maxEntries`` (int, default 100000, > 0).
- ``ttl`` (Go duration, default ``1h``, > 0).

Metrics (label ``plugin_name``): ``llm_d_epp_response_affinity_lookups_total{outcome}`` (``hit``,
``miss``, ``pod_gone``, ``not_candidate``), ``llm_d_epp_response_affinity_evictions_total{reason}``
(``ttl``, ``capacity``), ``llm_d_epp_response_affinity_bindings`` (gauge).

The built-in default configuration runs it first in its profile.

YAML::

    plugins:
      - type: response-affinity-filter
        parameters: {maxEntries: 200000, ttl: 2h}
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: response-affinity-filter
          - pluginRef: prefix-cache-scorer
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from prometheus_client import Counter, Gauge

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.metrics import metric_family
from epp.plugin.units import parse_duration

PREVIOUS_RESPONSE_FIELD: Final = "previous_response_id"


class ResponseAffinityFilter(PluginBase):
    TYPE: ClassVar[str] = "response-affinity-filter"

    @dataclass(frozen=True)
    class Params:
        max_entries: int = 100_000
        ttl: str = "1h"
        ttl_seconds: float = field(init=False, default=3600.0)

        def __post_init__(self) -> None:
            if self.max_entries <= 0:
                raise ValueError(f"maxEntries must be > 0, got {self.max_entries}")
            seconds = parse_duration(self.ttl)
            if seconds <= 0:
                raise ValueError(f"ttl must be > 0, got {self.ttl!r}")
            object.__setattr__(self, "ttl_seconds", seconds)

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        # response id -> (endpoint id, expiry); least recently bound or used first, which is
        # also earliest expiry first, so lapsed bindings are always at the front.
        self._bindings: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._target_key = f"{self.TYPE}/{self.typed_name.name}/target"
        registry = handle.registry
        label = self.typed_name.name
        lookups = metric_family(
            registry,
            Counter,
            "llm_d_epp_response_affinity_lookups",
            "Requests naming a previous response, by what the binding gave",
            ("plugin_name", "outcome"),
        )
        self._outcome = {
            o: lookups.labels(label, o) for o in ("hit", "miss", "pod_gone", "not_candidate")
        }
        evictions = metric_family(
            registry,
            Counter,
            "llm_d_epp_response_affinity_evictions",
            "Response bindings dropped, by reason",
            ("plugin_name", "reason"),
        )
        self._evicted = {r: evictions.labels(label, r) for r in ("ttl", "capacity")}
        self._size = metric_family(
            registry,
            Gauge,
            "llm_d_epp_response_affinity_bindings",
            "Response ids bound to an endpoint",
            ("plugin_name",),
        ).labels(label)

    # ---- Filter -------------------------------------------------------------------------------

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        previous = previous_response_id(request)
        if not previous:
            return endpoints
        bound = self._lookup(previous, cycle.now)
        if bound is None:
            self._outcome["miss"].inc()
            return endpoints
        for endpoint in endpoints:
            if endpoint.id == bound:
                self._outcome["hit"].inc()
                return [endpoint]
        in_pool = any(e.id == bound for e in self.handle.endpoints())
        self._outcome["not_candidate" if in_pool else "pod_gone"].inc()
        return endpoints

    # ---- PreRequest, ResponseComplete ---------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if targets:
            request.attributes[self._target_key] = targets[0]

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        if not response.response_id or not 200 <= response.status < 300:
            return
        target: Endpoint | None = request.attributes.get(self._target_key)
        served = self._served(response.served_endpoint)
        endpoint_id = served or (target.id if target is not None else "")
        if endpoint_id:
            self._bind(response.response_id, endpoint_id, self.handle.clock())

    # ---- StateDumper --------------------------------------------------------------------------

    def dump_state(self) -> Mapping[str, Any]:
        return {
            "bindings": len(self._bindings),
            "maxEntries": self.params.max_entries,
            "ttlSeconds": self.params.ttl_seconds,
        }

    # ---- bindings -----------------------------------------------------------------------------

    def _served(self, hostport: str) -> str:
        """The id of the endpoint Envoy reports as served (``""`` when unknown)."""
        if not hostport:
            return ""
        first = hostport.split(",", 1)[0].strip()
        return next((e.id for e in self.handle.endpoints() if e.hostport == first), "")

    def _lookup(self, response_id: str, now: float) -> str | None:
        entry = self._bindings.get(response_id)
        if entry is None:
            return None
        endpoint_id, expiry = entry
        if expiry <= now:
            self._expire(now)
            return None
        self._bindings[response_id] = (endpoint_id, now + self.params.ttl_seconds)
        self._bindings.move_to_end(response_id)
        return endpoint_id

    def _bind(self, response_id: str, endpoint_id: str, now: float) -> None:
        self._expire(now)
        self._bindings[response_id] = (endpoint_id, now + self.params.ttl_seconds)
        self._bindings.move_to_end(response_id)
        while len(self._bindings) > self.params.max_entries:
            self._bindings.popitem(last=False)
            self._evicted["capacity"].inc()
        self._size.set(len(self._bindings))

    def _expire(self, now: float) -> None:
        bindings = self._bindings
        while bindings:
            _, (_, expiry) = next(iter(bindings.items()))
            if expiry > now:
                break
            bindings.popitem(last=False)
            self._evicted["ttl"].inc()
        self._size.set(len(bindings))


def previous_response_id(request: InferenceRequest) -> str:
    """The ``previous_response_id`` a request body names (``""`` when none)."""
    body = request.body
    if body is None or body.payload is None:
        return ""
    value = body.payload.get(PREVIOUS_RESPONSE_FIELD)
    return value if isinstance(value, str) else ""
