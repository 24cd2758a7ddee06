"""``response-affinity-filter``: a Responses API follow-up goes to the server holding its previous
response. Our own type, beyond upstream (whose EPP ignores ``previous_response_id``).

A model server keeps Responses API state, the stored response and its conversation, in its own
memory (vLLM does, and so does ``epp sim``): a request naming ``previous_response_id`` gets 404
``response_not_found`` from any other server. Routed like any other request, such a follow-up
reaches the right one of four pods about one time in four.

Learning: as soon as a routed request's 2xx response shows its response id (the ``response.id`` of
the streamed ``response.created`` event, on the first chunk; the JSON ``id`` of a non-streamed
stored response, read when its body is), the id is bound to the endpoint that served it: the
served endpoint Envoy reports when it is known, else the request's primary target. That is the
``ResponseStreaming`` hook, once per request: a streamed response's binding is in place a whole
generation before the client can send its follow-up. ``ResponseComplete`` binds too when the
hook could not (an id only in ``response.completed``), and is a no-op otherwise. Only a 2xx answer
to a Responses API request (parser kind ``responses``) carries an id: for any other response the
filter tells the EPP it does not need the body (``ResponseBodyNeed``).

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
``ttl`` after it was last bound or used. About 250 bytes per binding.

Shared between EPP replicas (``epp.plugin.SharedState``, with a cross-replica syncer configured):
a follow-up may reach any replica, so every replica must know every binding.

- ``export_facts()`` drains the bindings learned here since the last call, one fact each:
  ``{"id": <response id>, "endpoint": <endpoint id>, "age": <seconds since bound>}``. A burst is
  capped at 4096 per call, oldest dropped first. Only bindings learned from a response here are
  exported: bindings applied from peers are not (no echo), and a lookup's TTL refresh stays
  local (the peer's copy lapses ``ttl`` after the binding, unless that replica uses it too).
- ``apply_facts(facts, origin)`` inserts each binding with the recency it had when exported:
  it lapses ``ttl - age`` from now. Replicas share no clock, so the age is measured at export and
  time in transit (one sync interval, more for a replayed log) is not counted: an applied
  binding may outlive the original by that much. A binding this replica already holds at least as
  recently is kept, whatever the fact says, so an older, reordered fact changes nothing, and a
  duplicate at most extends the lapse by the time between its two deliveries; a more recent one
  replaces it. Malformed facts and facts older than ``ttl`` are ignored.
- Fairness under ``maxEntries``: eviction is by recency alone, whoever learned the binding. A
  peer's binding goes where its recency puts it, so it can push out only bindings used less
  recently than itself, never a fresher local one; when it is the least recent of all it is the
  one dropped. Every replica holds the bindings of the whole pool, so size ``maxEntries`` for the
  pool's rate of new responses times ``ttl``, not one replica's.
- Staleness: every new binding asks for prompt sharing (``Handle.share_soon``), so the other
  replicas hold it milliseconds after it is learned (the engine's publish gap, 5 to 20 ms
  under load, plus a transport round trip), for a streamed response long before the follow-up
  can come; only a follow-up sent within those milliseconds of a non-streamed answer can reach
  another replica first and be routed as a ``miss``.

Parameters:

- ``maxEntries`` (int, default 100000, > 0).
- ``ttl`` (Go duration, default ``1h``, > 0).

Metrics (label ``plugin_name``): ``llm_d_epp_response_affinity_lookups_total{outcome}`` (``hit``,
``miss``, ``pod_gone``, ``not_candidate``), ``llm_d_epp_response_affinity_evictions_total{reason}``
(``ttl``, ``capacity``), ``llm_d_epp_response_affinity_bindings`` (gauge),
``llm_d_epp_response_affinity_shared_total{event}`` (``exported``, ``export_dropped``,
``applied``, ``ignored``).

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

import heapq
import itertools
import math
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
MAX_EXPORT: Final = 4096
"""Bindings one ``export_facts`` call hands over at most (the oldest are dropped first)."""
MAX_ID_LENGTH: Final = 1024
"""Longest response or endpoint id accepted from a peer."""
_COMPACT_SLACK: Final = 1024  # stale heap entries tolerated beyond the live count


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
        # response id -> (endpoint id, expiry, seq); expiry = last bound or used + ttl. The heap
        # holds (expiry, seq, response id) for every write, live while its seq is the dict's: its
        # front is the least recently bound or used binding, whoever learned it.
        self._bindings: dict[str, tuple[str, float, int]] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._seq = itertools.count()
        # bindings learned here, not exported yet: response id -> (endpoint id, bound at); None
        # until the sync engine first asks (``export_facts``): without a syncer nothing is queued
        self._pending: OrderedDict[str, tuple[str, float]] | None = None
        self._target_key = f"{self.TYPE}/{self.typed_name.name}/target"
        self._bound_key = f"{self.TYPE}/{self.typed_name.name}/bound"
        self._register_metrics(handle)

    def _register_metrics(self, handle: Handle) -> None:
        registry, label = handle.registry, self.typed_name.name
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
        shared = metric_family(
            registry,
            Counter,
            "llm_d_epp_response_affinity_shared",
            "Response bindings shared with other EPP replicas, by event",
            ("plugin_name", "event"),
        )
        events = ("exported", "export_dropped", "applied", "ignored")
        self._shared = {e: shared.labels(label, e) for e in events}

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

    # ---- PreRequest, ResponseStreaming, ResponseComplete --------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        if targets:
            request.attributes[self._target_key] = targets[0]

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        """``ResponseBodyNeed``: the body of a successful Responses API answer, which carries the
        response id (no other API's response does)."""
        body = request.body
        return 200 <= response.status < 300 and body is not None and body.kind == "responses"

    def response_streaming(self, request: InferenceRequest, response: ResponseInfo) -> None:
        """Bind as soon as the response id is known (once per request; every chunk asks)."""
        if response.response_id and self._bound_key not in request.attributes:
            self._learn(request, response)

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        """The fallback: binds what ``response_streaming`` did not."""
        if response.response_id and self._bound_key not in request.attributes:
            self._learn(request, response)

    def _learn(self, request: InferenceRequest, response: ResponseInfo) -> None:
        request.attributes[self._bound_key] = True
        if not 200 <= response.status < 300:
            return
        target: Endpoint | None = request.attributes.get(self._target_key)
        served = self._served(response.served_endpoint)
        endpoint_id = served or (target.id if target is not None else "")
        if endpoint_id:
            self._bind(response.response_id, endpoint_id, self.handle.clock())
            self.handle.share_soon()

    # ---- SharedState --------------------------------------------------------------------------

    def export_facts(self) -> list[Any]:
        """The bindings learned here since the last call (see the module docstring); the first
        call starts the queueing."""
        if self._pending is None:
            self._pending = OrderedDict()
        if not self._pending:
            return []
        now = self.handle.clock()
        facts = [
            {"id": rid, "endpoint": eid, "age": max(0.0, now - bound)}
            for rid, (eid, bound) in self._pending.items()
        ]
        self._pending.clear()
        self._shared["exported"].inc(len(facts))
        return facts

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        """Merge bindings another replica learned (see the module docstring)."""
        now = self.handle.clock()
        self._expire(now)
        applied = 0
        for fact in facts:
            if self._apply_one(fact, now):
                applied += 1
        if applied:
            self._trim()
        self._shared["applied"].inc(applied)
        self._shared["ignored"].inc(len(facts) - applied)
        self._size.set(len(self._bindings))

    def _apply_one(self, fact: Any, now: float) -> bool:
        if not isinstance(fact, dict):
            return False
        rid, eid, age = fact.get("id"), fact.get("endpoint"), fact.get("age")
        if not (_is_id(rid) and _is_id(eid)) or not _is_age(age):
            return False
        expiry = now + self.params.ttl_seconds - age
        if expiry <= now:
            return False
        held = self._bindings.get(rid)
        if held is not None and held[1] >= expiry:
            return False  # ours is at least as recent: duplicates and old facts stop here
        self._set(rid, eid, expiry)
        return True

    # ---- StateDumper --------------------------------------------------------------------------

    def dump_state(self) -> Mapping[str, Any]:
        return {
            "bindings": len(self._bindings),
            "maxEntries": self.params.max_entries,
            "ttlSeconds": self.params.ttl_seconds,
            "pendingExport": len(self._pending) if self._pending is not None else 0,
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
        endpoint_id, expiry, _ = entry
        if expiry <= now:
            self._expire(now)
            return None
        self._set(response_id, endpoint_id, now + self.params.ttl_seconds)
        return endpoint_id

    def _bind(self, response_id: str, endpoint_id: str, now: float) -> None:
        self._expire(now)
        self._set(response_id, endpoint_id, now + self.params.ttl_seconds)
        self._trim()
        self._size.set(len(self._bindings))
        pending = self._pending
        if pending is None:
            return
        pending[response_id] = (endpoint_id, now)
        pending.move_to_end(response_id)
        if len(pending) > MAX_EXPORT:
            pending.popitem(last=False)
            self._shared["export_dropped"].inc()

    def _set(self, response_id: str, endpoint_id: str, expiry: float) -> None:
        seq = next(self._seq)
        self._bindings[response_id] = (endpoint_id, expiry, seq)
        heapq.heappush(self._heap, (expiry, seq, response_id))
        if len(self._heap) > 2 * len(self._bindings) + _COMPACT_SLACK:
            self._heap = sorted((exp, n, rid) for rid, (_, exp, n) in self._bindings.items())

    def _pop_live(self) -> bool:
        """Pop the heap's front; True if it was a live binding (then deleted)."""
        _, seq, rid = heapq.heappop(self._heap)
        entry = self._bindings.get(rid)
        if entry is None or entry[2] != seq:
            return False  # superseded by a later write
        del self._bindings[rid]
        return True

    def _trim(self) -> None:
        while len(self._bindings) > self.params.max_entries:
            if self._pop_live():
                self._evicted["capacity"].inc()

    def _expire(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            if self._pop_live():
                self._evicted["ttl"].inc()
        self._size.set(len(self._bindings))


def _is_id(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH


def _is_age(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def previous_response_id(request: InferenceRequest) -> str:
    """The ``previous_response_id`` a request body names (``""`` when none)."""
    body = request.body
    if body is None or body.payload is None:
        return ""
    value = body.payload.get(PREVIOUS_RESPONSE_FIELD)
    return value if isinstance(value, str) else ""
