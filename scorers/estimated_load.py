"""``estimated-load-scorer``: prefer endpoints with the fewest requests waiting or running, as
scraped from the model servers and brought up to date with this EPP's own dispatches and
completions since the scrape (category Distribution). This EPP's own type: llm-d has no such
scorer.

Reads ``LoadEstimate/<inFlightLoadProducerName>`` (``epp.plugin.inflight.LOAD_ESTIMATE``,
published by ``inflight-load-producer``): per endpoint ``v = waiting + running`` at its last scrape
``+`` this EPP's requests dispatched there since and still in flight ``-`` its requests dispatched
before the scrape that have completed since (never below this EPP's own in-flight count there;
this EPP's in-flight count alone when the endpoint has no fresh metrics). With ``M`` the largest
``v`` among the candidates::

    score = (M - v) / M        # all idle (M == 0): 1.0 each; all equally busy: 0.0 each

An endpoint missing from the data counts as ``v = 0``.

Why this and not ``queue-scorer``'s min-max: ``(M - v) / M`` is the shape of
``active-request-scorer``, so a configuration that swaps one for the other changes the signal and
nothing else; and it is proportional: an idle pod against a busy one spans the whole range, while
100 against 101 requests differs by 1% instead of the whole range, so a one-request difference
between busy pods does not outweigh prefix-cache affinity. Unlike ``queue-scorer`` (scraped only,
up to a scrape interval old) it sees this EPP's requests the moment they are dispatched; unlike
``active-request-scorer`` (this EPP's requests only) it sees the load other EPP replicas and
other clients put on the servers.

The scorer declares ``InFlightLoad/<inFlightLoadProducerName>`` (the data type the loader knows
``inflight-load-producer`` as the default producer of), so the loader creates the producer when
no config declares it; the same producer publishes the ``LoadEstimate``. When the producer of
that name publishes no ``LoadEstimate`` (one of another make), the scorer scores
``InFlightLoad.requests`` with the same formula.

It offers ``score_list`` (``ListScorer``): the same scores as a list in candidate order,
which the scheduler sums without lookups; ``score`` is that list keyed by id.

Parameters: ``inFlightLoadProducerName`` (``inflight-load-producer``).

YAML::

    plugins:
      - type: estimated-load-scorer
      - type: prefix-cache-scorer
    schedulingProfiles:
      - name: default
        plugins:
          - pluginRef: estimated-load-scorer
            weight: 2
          - pluginRef: prefix-cache-scorer
            weight: 3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any, ClassVar

from epp.plugin import (
    CycleState,
    DataKey,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
)
from epp.plugin.inflight import INFLIGHT_LOAD, LOAD_ESTIMATE, InFlightLoad

_id = attrgetter("id")


class EstimatedLoadScorer(PluginBase):
    TYPE: ClassVar[str] = "estimated-load-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        in_flight_load_producer_name: str = "inflight-load-producer"

        def __post_init__(self) -> None:
            if not self.in_flight_load_producer_name:
                raise ValueError("inFlightLoadProducerName must not be empty")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._estimate_key = LOAD_ESTIMATE.key(params.in_flight_load_producer_name)
        self._load_key = INFLIGHT_LOAD.key(params.in_flight_load_producer_name)

    def consumes(self) -> frozenset[DataKey[Any]]:
        return frozenset({self._load_key})

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        scores = self.score_list(cycle, request, endpoints)
        return {e.id: s for e, s in zip(endpoints, scores, strict=True)}

    def score_list(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> list[float]:
        """``score`` in candidate order (``ListScorer``)."""
        loads = self._loads(request, endpoints)
        top = max(loads, default=0.0)
        if top <= 0.0:
            return [1.0] * len(endpoints)
        # v < 0 (no producer of ours reports it) would score above 1: clamp
        return [(top - v) / top if v >= 0.0 else 1.0 for v in loads]

    def _loads(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        """Each endpoint's load, in the order of ``endpoints`` (an endpoint missing from the
        data counts 0)."""
        estimates = self._estimate_key.get(request)
        if estimates is not None:
            ids = list(map(_id, endpoints))
            if list(estimates.keys()) == ids:  # keyed in candidate order (the usual case)
                return list(estimates.values())
            # One copy into a plain dict (the producer's mapping is lazy), then dict-speed lookups.
            get = dict(estimates.items()).get
            return list(map(get, ids, repeat(0.0)))
        inflight: Mapping[str, InFlightLoad] = self._load_key.get(request) or {}
        return [float(inflight[e.id].requests) if e.id in inflight else 0.0 for e in endpoints]
