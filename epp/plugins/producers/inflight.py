"""``inflight-load-producer``: the load on each endpoint, from this EPP's own requests and from
the model servers' scraped queues.

Scraped queue lengths are up to one scrape interval old; every request scheduled inside that
window sees the same numbers and picks the same "least loaded" pod. The EPP, however, knows
exactly what it dispatched: this producer counts, per endpoint, the requests it has sent and that
have not completed, and their uncached prompt tokens.

- A request is counted on its primary target at PreRequest (after scheduling).
- Its tokens are released when the response starts (response headers: prefill is over); the
  request itself is released when the response completes, or when the stream ends for any other
  reason (client disconnect, error).
- Uncached prompt tokens = prompt tokens (from ``TokenizedPrompt/<tokenProducer>``) minus the
  tokens the chosen endpoint already caches (``PrefixCacheMatchInfo/<prefixProducer>``, when a
  prefix producer ran), plus, with ``addEstimatedOutputTokens``, ``min(outputRatio · prompt,
  maxEstimatedOutputTokens)``.

It publishes, for every candidate:

- ``InFlightLoad/<name>``: ``Mapping[endpoint id, InFlightLoad(requests, tokens)]``, read by
  ``active-request-scorer`` and ``token-load-scorer`` (upstream's data): this EPP's counts plus,
  with peers (below), every other replica's, summed as upstream sums them; computed for all
  candidates when first read (during scoring) and fixed from there;
- ``LoadEstimate/<name>``: ``Mapping[endpoint id, float]``, read by ``estimated-load-scorer``
  (this EPP's own data; exact formula in ``epp.plugin.inflight.LOAD_ESTIMATE``): the endpoint's
  scraped ``waiting + running`` at its scrape time ``t``, plus the change since ``t`` of this
  EPP's in-flight requests there (its dispatches after ``t`` still in flight, minus completions
  after ``t`` of those sent before) and of the peers' as known here; never below this EPP's own
  in-flight count. Metrics missing or older than ``metricsStalenessThreshold`` → the in-flight
  count of every replica known here. Computed for all candidates when first read (during
  scoring) and fixed from there; a configuration that never reads it pays one small object per
  request.

Across EPP replicas (``epp.plugin.SharedState``, when a cross-replica syncer is configured and
``syncCrossReplicaState`` is on): each replica exports its own absolute (requests, tokens) of the
endpoints that changed since the last export, and of all of them every
``crossReplicaRefreshInterval`` (a full refresh, also its heartbeat). Applied facts are never
re-exported. The receiver keeps each origin's newest counts, so duplicates and reordered facts
change nothing and a lost one is healed by the next change or refresh, and drops an origin that
sent nothing newer for ``crossReplicaStateTtl`` (fact format and rules:
``epp.plugins.producers.inflight_peers``). Staleness: a peer's dispatch or completion shows here
one sync interval (200 ms) plus transport later; a dead peer's load lingers up to the TTL. Keep
the TTL several sync intervals long: shorter than the sync interval, it drops live peers.

To know which of its requests a scrape has seen, the producer keeps each in-flight request's
dispatch time, and per endpoint the (completion, dispatch) times of recent completions. A record
is dropped when the endpoint is estimated from a scrape taken after the completion (that scrape
has seen it), or once older than ``metricsStalenessThreshold`` (a scrape that old is not used),
and an endpoint keeps at most 4096: memory is the requests in flight plus, per endpoint, about
one scrape interval of completions. Times are the handle's monotonic clock, the clock
``Metrics.update_time`` is read on (so dispatch times come in order). ``update_time`` is taken
when a scrape's response has arrived, so a request dispatched while that scrape was on the wire
counts as seen by it; the ``own`` floor keeps such a request counted.

Metrics: ``llm_d_epp_inflight_requests`` and ``llm_d_epp_inflight_tokens`` per endpoint, fairness id
and priority (``epp.plugins.producers.inflight_metrics``).

Parameters: ``addEstimatedOutputTokens`` (false), ``outputRatio`` (1.5),
``maxEstimatedOutputTokens`` (0 = no cap), ``tokenProducerName`` (``token-producer``),
``prefixProducerName`` (``approx-prefix-cache-producer``; upstream's name for it,
``prefixMatchInfoProducerName``, is accepted and wins when set), ``metricsStalenessThreshold`` (Go
duration, ``2s``, > 0; the EPP's ``--metrics-staleness-threshold`` default: about forty missed
50 ms scrapes, long enough to ride out a slow scrape, short enough that a pod whose scrapes stop
is judged by what this EPP knows rather than by a number that no longer describes it),
``syncCrossReplicaState`` (true; upstream's: false keeps the load local),
``crossReplicaRefreshInterval`` (Go duration, ``1s``, > 0), ``crossReplicaStateTtl`` (Go
duration, ``5s``, > the refresh interval).

YAML::

    - type: inflight-load-producer
      parameters: {addEstimatedOutputTokens: true, outputRatio: 1.5, metricsStalenessThreshold: 2s,
                   syncCrossReplicaState: true, crossReplicaStateTtl: 5s}
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import (
    Callable,
    ItemsView,
    Iterator,
    KeysView,
    Mapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, TypeVar, overload

from epp.plugin import (
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.inflight import INFLIGHT_LOAD, LOAD_ESTIMATE, InFlightLoad
from epp.plugin.prefix import PREFIX_MATCH_INFO, TOKENIZED_PROMPT
from epp.plugin.units import parse_duration
from epp.plugins.producers.inflight_metrics import InflightGauges, Labels
from epp.plugins.producers.inflight_peers import LoadPublisher, PeerLoads

_T = TypeVar("_T")
_IDLE: Final = InFlightLoad(0, 0)
MAX_COMPLETIONS: Final = 4096
"""Completion records kept per endpoint at most (oldest dropped first)."""


class InflightLoadProducer(PluginBase):
    TYPE: ClassVar[str] = "inflight-load-producer"

    @dataclass(frozen=True)
    class Params:
        add_estimated_output_tokens: bool = False
        output_ratio: float = 1.5
        max_estimated_output_tokens: int = 0
        token_producer_name: str = "token-producer"
        prefix_producer_name: str = "approx-prefix-cache-producer"
        prefix_match_info_producer_name: str = ""
        metrics_staleness_threshold: str = "2s"
        sync_cross_replica_state: bool = True
        cross_replica_refresh_interval: str = "1s"
        cross_replica_state_ttl: str = "5s"
        staleness_seconds: float = field(init=False, default=2.0)
        refresh_seconds: float = field(init=False, default=1.0)
        ttl_seconds: float = field(init=False, default=5.0)

        def __post_init__(self) -> None:
            if self.output_ratio < 0:
                raise ValueError("outputRatio must be >= 0")
            if self.max_estimated_output_tokens < 0:
                raise ValueError("maxEstimatedOutputTokens must be >= 0")
            seconds = parse_duration(self.metrics_staleness_threshold)
            if seconds <= 0.0:
                raise ValueError(
                    "metricsStalenessThreshold must be > 0, "
                    f"got {self.metrics_staleness_threshold!r}"
                )
            object.__setattr__(self, "staleness_seconds", seconds)
            refresh = parse_duration(self.cross_replica_refresh_interval)
            ttl = parse_duration(self.cross_replica_state_ttl)
            if refresh <= 0.0:
                raise ValueError("crossReplicaRefreshInterval must be > 0")
            if ttl <= refresh:
                raise ValueError("crossReplicaStateTtl must be longer than the refresh interval")
            object.__setattr__(self, "refresh_seconds", refresh)
            object.__setattr__(self, "ttl_seconds", ttl)

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._key = INFLIGHT_LOAD.key(self.typed_name.name)
        self._estimate_key = LOAD_ESTIMATE.key(self.typed_name.name)
        self._tokens_key = TOKENIZED_PROMPT.key(params.token_producer_name)
        prefix = params.prefix_match_info_producer_name or params.prefix_producer_name
        self._prefix_key = PREFIX_MATCH_INFO.key(prefix)
        self._stale = params.staleness_seconds
        # endpoint id → {request id: dispatch time} of its in-flight requests, in dispatch order
        self._dispatched: dict[str, dict[str, float]] = {}
        self._tokens: dict[str, int] = {}
        # request id → (endpoint id, tokens still counted)
        self._open: dict[str, tuple[str, int]] = {}
        # request id → its series of the in-flight gauges (``inflight_metrics``)
        self._gauges = InflightGauges(handle.registry, self.typed_name.name)
        self._series: dict[str, Labels] = {}
        # endpoint id → (completion time, dispatch time) of recent completions, completion order
        self._completed: dict[str, deque[tuple[float, float]]] = {}
        self._swept_at = 0.0
        # endpoint id → (metrics, valid until, estimate): the last estimate, reused while the
        # endpoint's metrics are the same object and the time is before ``valid until``; a
        # dispatch or completion there drops it, a change of the peers' loads drops them all
        self._memo: dict[str, tuple[object, float, float]] = {}
        self._memo_generation = 0
        # endpoint id → [scrape time, this replica's dispatches there since it and still in
        # flight, completions since it of requests sent before it]: updated by every dispatch
        # and completion, counted again (a walk of the records) only for a newer scrape
        self._since: dict[str, list[float]] = {}
        self._sync = params.sync_cross_replica_state
        self._publisher = LoadPublisher(params.refresh_seconds)
        self._peers = PeerLoads(params.ttl_seconds, self._stale)

    def produces(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._key, self._estimate_key})

    async def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        attributes = request.attributes
        peers = self._peers
        if peers.origins:
            peers.expire(self.handle.clock())
        attributes[self._key] = LazyLoads(self._loads, endpoints)
        attributes[self._estimate_key] = LoadEstimates(self, endpoints)

    def _loads(self, endpoints: Sequence[Endpoint]) -> dict[str, InFlightLoad]:
        """``InFlightLoad`` of each endpoint now: this replica's, plus its peers' when known."""
        if self._peers.totals:
            return self._pool_loads(endpoints)
        disp, tok = self._dispatched, self._tokens
        return {
            e.id: InFlightLoad(len(disp[e.id]), tok.get(e.id, 0)) if e.id in disp else _IDLE
            for e in endpoints
        }

    def _pool_loads(self, endpoints: Sequence[Endpoint]) -> dict[str, InFlightLoad]:
        """This replica's load on each endpoint plus its peers' (``InFlightLoad`` with peers)."""
        disp, tok, totals = self._dispatched, self._tokens, self._peers.totals
        out: dict[str, InFlightLoad] = {}
        for e in endpoints:
            eid = e.id
            opened = disp.get(eid)
            requests, tokens = (len(opened), tok.get(eid, 0)) if opened else (0, 0)
            peer = totals.get(eid)
            if peer is not None:
                requests, tokens = requests + peer[0], tokens + peer[1]
            out[eid] = InFlightLoad(requests, tokens) if requests or tokens else _IDLE
        return out

    def _own(self, endpoint_id: str) -> tuple[int, int]:
        opened = self._dispatched.get(endpoint_id)
        return (len(opened) if opened else 0), self._tokens.get(endpoint_id, 0)

    # ---- SharedState: see the module docstring and epp.plugins.producers.inflight_peers ----

    def export_facts(self) -> list[Any]:
        if not self._sync:
            return []
        return self._publisher.export(self.handle.clock(), self._own, self._dispatched.keys)

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        if self._sync and facts:
            self._peers.apply(facts, origin, self.handle.clock(), self._publisher.token)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.primary.targets
        rid = request.request_id
        if not targets or rid in self._open:
            return
        eid = targets[0].id
        tokens = self._uncached_tokens(request, eid)
        opened = self._dispatched.get(eid)
        if opened is None:
            opened = self._dispatched[eid] = {}
        now = opened[rid] = self.handle.clock()
        self._memo.pop(eid, None)
        since = self._since.get(eid)
        if since is not None and now > since[0]:
            since[1] += 1
        self._tokens[eid] = self._tokens.get(eid, 0) + tokens
        self._open[rid] = (eid, tokens)
        series = self._series[rid] = self._gauges.labels(eid, request.fairness_id, request.priority)
        self._gauges.add(series, 1, tokens)
        if self._sync:
            self._publisher.touch(eid)

    def response_headers(
        self, request: InferenceRequest, response: ResponseInfo, set_headers: dict[str, str]
    ) -> None:
        entry = self._open.get(request.request_id)
        if entry is not None and entry[1]:
            eid, tokens = entry
            self._tokens[eid] = max(0, self._tokens.get(eid, 0) - tokens)
            self._open[request.request_id] = (eid, 0)
            self._gauges.add(self._series[request.request_id], 0, -tokens)
            if self._sync:
                self._publisher.touch(eid)

    def needs_response_body(self, request: InferenceRequest, response: ResponseInfo) -> bool:
        return False  # ResponseBodyNeed: headers and completion are all the tracker reads

    def response_complete(self, request: InferenceRequest, response: ResponseInfo) -> None:
        rid = request.request_id
        entry = self._open.pop(rid, None)
        if entry is None:
            return
        eid, tokens = entry
        self._gauges.add(self._series.pop(rid), -1, -tokens)
        now = self.handle.clock()
        self._memo.pop(eid, None)
        if self._sync:
            self._publisher.touch(eid)
        opened = self._dispatched.get(eid, {})
        dispatched_at = opened.pop(rid, now)
        if opened:
            self._tokens[eid] = max(0, self._tokens.get(eid, 0) - tokens)
        else:
            self._dispatched.pop(eid, None)
            self._tokens.pop(eid, None)
        done = self._completed.get(eid)
        if done is None:
            done = self._completed[eid] = deque(maxlen=MAX_COMPLETIONS)
        since = self._since.get(eid)
        if since is not None:
            if dispatched_at > since[0]:
                since[1] -= 1  # no longer in flight
            elif now > since[0]:
                since[2] += 1  # the scrape counted it; it has ended since
        if len(done) == MAX_COMPLETIONS or _drop_until(done, now - self._stale):
            self._since.pop(eid, None)  # a record the count may hold goes: count again
        done.append((now, dispatched_at))
        if now - self._swept_at > self._stale:
            self._sweep(now)

    def estimates(self, endpoints: Sequence[Endpoint]) -> dict[str, float]:
        """``LoadEstimate`` of each endpoint now (see the module docstring).

        An endpoint's estimate depends on its metrics, its own dispatches and completions, the
        peers' loads and, through freshness, the time: it is computed again only when one of
        them has changed (``_memo``), so a request costs one lookup per endpoint whose state is
        as it was, however many endpoints there are."""
        now = self.handle.clock()
        memo = self._memo
        if self._memo_generation != self._peers.generation:
            memo.clear()
            self._memo_generation = self._peers.generation
        out: dict[str, float] = {}
        for e in endpoints:
            eid, m = e.id, e.metrics
            held = memo.get(eid)
            if held is not None and held[0] is m and now <= held[1]:
                out[eid] = held[2]
                continue
            value, until = self._estimate_fresh(e, now)
            memo[eid] = (m, until, value)
            out[eid] = value
        return out

    def _estimate_fresh(self, endpoint: Endpoint, now: float) -> tuple[float, float]:
        """(estimate, the time until which it holds unless something changes)."""
        eid, m = endpoint.id, endpoint.metrics
        fresh = m is not None and m.update_time > 0.0 and m.update_time >= now - self._stale
        until = m.update_time + self._stale if fresh and m is not None else math.inf
        if eid in self._dispatched or eid in self._completed or self._peers.has_history(eid):
            return self._estimate(endpoint, now), until
        if fresh and m is not None:  # nothing of ours there: the scrape alone, when fresh
            return float(m.waiting_queue_size + m.running_requests_size), until
        return 0.0, until

    def dump_state(self) -> dict[str, Any]:
        return {
            "requests": {eid: len(opened) for eid, opened in self._dispatched.items()},
            "tokens": dict(self._tokens),
            "open": len(self._open),
            "completionRecords": {eid: len(done) for eid, done in self._completed.items()},
            "peers": {name: len(o.loads) for name, o in self._peers.origins.items()},
            "peerLoad": {eid: list(load) for eid, load in self._peers.totals.items()},
        }

    def _estimate(self, endpoint: Endpoint, now: float) -> float:
        eid = endpoint.id
        opened = self._dispatched.get(eid)
        own = len(opened) if opened else 0
        m = endpoint.metrics
        if m is None or m.update_time <= 0.0 or m.update_time < now - self._stale:
            peer = self._peers.totals.get(eid)
            return float(own + peer[0]) if peer is not None else float(own)
        scraped_at = m.update_time
        dispatched, completed = self._counts_since(eid, scraped_at)
        seen = m.waiting_queue_size + m.running_requests_size - completed
        seen += self._peers.requests_since(eid, scraped_at)
        return float(max(own, max(0, seen) + dispatched))

    def _counts_since(self, eid: str, scraped_at: float) -> tuple[int, int]:
        """(this replica's requests sent there after ``scraped_at`` and still in flight, its
        requests sent at or before it that completed after it)."""
        since = self._since.get(eid)
        if since is not None and since[0] == scraped_at:
            return int(since[1]), int(since[2])
        completed = 0
        done = self._completed.get(eid)
        if done is not None:
            _drop_until(done, scraped_at)  # the scrape has seen every earlier completion
            if done:
                completed = sum(1 for _, sent in done if sent <= scraped_at)
            else:
                del self._completed[eid]
        dispatched = 0
        opened = self._dispatched.get(eid)
        if opened:
            for sent in reversed(opened.values()):  # newest first; stop at the scrape
                if sent <= scraped_at:
                    break
                dispatched += 1
        self._since[eid] = [scraped_at, dispatched, completed]
        return dispatched, completed

    def _sweep(self, now: float) -> None:
        """Drop completion records nobody can use any more (endpoints that are not scored), and
        the memo of endpoints with nothing of this replica's (gone ones included)."""
        self._swept_at = now
        horizon = now - self._stale
        for eid in list(self._completed):
            done = self._completed[eid]
            if _drop_until(done, horizon):
                self._since.pop(eid, None)
            if not done:
                del self._completed[eid]
        memo = self._memo
        idle = [e for e in {*memo, *self._since} if e not in self._dispatched]
        for eid in idle:
            held = memo.get(eid)
            # gone endpoints' entries do not pile up; a memo still valid stays
            if eid not in self._completed and (held is None or not now < held[1] < math.inf):
                memo.pop(eid, None)
                self._since.pop(eid, None)

    def _uncached_tokens(self, request: InferenceRequest, endpoint_id: str) -> int:
        prompt = request.attributes.get(self._tokens_key)
        count = int(getattr(prompt, "token_count", 0))
        infos = request.attributes.get(self._prefix_key)
        info = infos.get(endpoint_id) if infos else None
        cached = info.match_blocks * info.block_size_tokens if info is not None else 0
        tokens = max(0, count - cached)
        if self.params.add_estimated_output_tokens:
            est = int(self.params.output_ratio * count)
            if self.params.max_estimated_output_tokens:
                est = min(est, self.params.max_estimated_output_tokens)
            tokens += est
        return tokens


def _drop_until(done: deque[tuple[float, float]], until: float) -> bool:
    """Drop the records of completions at or before ``until`` (the oldest come first); whether
    any was dropped."""
    dropped = False
    while done and done[0][0] <= until:
        done.popleft()
        dropped = True
    return dropped


class LazyLoads(Mapping[str, InFlightLoad]):
    """``InFlightLoad/<name>`` of one request: computed for all its candidates on first read
    (at scoring time, like ``LoadEstimates``), then fixed; a configuration whose scorers do not
    read it (the built-in default) pays one small object per request, not one per endpoint."""

    __slots__ = ("_compute", "_endpoints", "_values")

    def __init__(
        self,
        compute: Callable[[Sequence[Endpoint]], dict[str, InFlightLoad]],
        endpoints: Sequence[Endpoint],
    ) -> None:
        self._compute: Callable[[Sequence[Endpoint]], dict[str, InFlightLoad]] | None = compute
        self._endpoints = endpoints
        self._values: dict[str, InFlightLoad] | None = None

    def values_by_id(self) -> dict[str, InFlightLoad]:
        values = self._values
        if values is None:
            assert self._compute is not None
            values = self._values = self._compute(self._endpoints)
            self._compute, self._endpoints = None, ()
        return values

    def __getitem__(self, endpoint_id: str) -> InFlightLoad:
        return self.values_by_id()[endpoint_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values_by_id())

    def __len__(self) -> int:
        return len(self.values_by_id())

    def __contains__(self, endpoint_id: object) -> bool:
        return endpoint_id in self.values_by_id()

    def get(self, endpoint_id: str, /, default: object = None) -> object:  # type: ignore[override]
        return self.values_by_id().get(endpoint_id, default)

    def __repr__(self) -> str:
        return f"LazyLoads({self.values_by_id()!r})"


class LoadEstimates(Mapping[str, float]):
    """``LoadEstimate/<name>`` of one request: computed for all its candidates on first read
    (so at scoring time, with everything dispatched and completed until then), then fixed."""

    __slots__ = ("_endpoints", "_producer", "_values")

    def __init__(self, producer: InflightLoadProducer, endpoints: Sequence[Endpoint]) -> None:
        self._producer: InflightLoadProducer | None = producer
        self._endpoints = endpoints
        self._values: dict[str, float] | None = None

    def values_by_id(self) -> dict[str, float]:
        """The estimates as a plain dict (computed on the first call)."""
        values = self._values
        if values is None:
            assert self._producer is not None
            values = self._values = self._producer.estimates(self._endpoints)
            self._producer, self._endpoints = None, ()
        return values

    def __getitem__(self, endpoint_id: str) -> float:
        return self.values_by_id()[endpoint_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values_by_id())

    def __len__(self) -> int:
        return len(self.values_by_id())

    def __contains__(self, endpoint_id: object) -> bool:
        return endpoint_id in self.values_by_id()

    # The plain dict's own methods, so a consumer's lookups run at dict speed.
    @overload
    def get(self, endpoint_id: str, /) -> float | None: ...
    @overload
    def get(self, endpoint_id: str, /, default: float | _T) -> float | _T: ...
    def get(self, endpoint_id: str, /, default: object = None) -> object:
        values = self._values
        if values is None:
            values = self.values_by_id()
        return values.get(endpoint_id, default)

    def items(self) -> ItemsView[str, float]:
        return self.values_by_id().items()

    def keys(self) -> KeysView[str]:
        return self.values_by_id().keys()

    def values(self) -> ValuesView[float]:
        return self.values_by_id().values()

    def __repr__(self) -> str:
        return f"LoadEstimates({self.values_by_id()!r})"
