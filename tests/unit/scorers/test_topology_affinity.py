from __future__ import annotations

import dataclasses

from epp.plugin import (
    DataKey,
    Endpoint,
    InferenceRequest,
    Metrics,
    Scorer,
    ScorerCategory,
    Stability,
    Topology,
    with_attribute,
)
from epp.plugin.params import decode
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.testing import check_scorer, sample_endpoints
from epp.plugin.topology import topology_key
from scorers.topology_affinity import TopologyAffinityScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request

KEY = topology_key()
PEER = Topology(hostname="h1", rack="r1", zone="z1", region="eu")
CANDIDATES = [
    Topology("h1", "r1", "z1", "eu"),
    Topology("h2", "r1", "z1", "eu"),
    Topology("h3", "r2", "z1", "eu"),
    Topology("h4", "r3", "z2", "eu"),
    Topology("h5", "r4", "z3", "us"),
    None,
]


def _ep(i: int, topology: Topology | None, key: DataKey[Topology] = KEY) -> Endpoint:
    return dataclasses.replace(make_endpoint(i), metrics=with_attribute(Metrics(), key, topology))


def _scorer(producer: str = "") -> TopologyAffinityScorer:
    params = {"topologyProducerName": producer} if producer else {}
    decoded = decode(TopologyAffinityScorer.Params, params)
    return TopologyAffinityScorer(name="", params=decoded, handle=handle())


def _request(peer: Endpoint | None) -> InferenceRequest:
    request = make_request()
    if peer is not None:
        PEER_ENDPOINT.put(request, peer)
    return request


def _scores(scorer: TopologyAffinityScorer, request: InferenceRequest) -> list[float]:
    endpoints = [_ep(i + 1, t) for i, t in enumerate(CANDIDATES)]
    out = scorer.score(make_cycle(), request, endpoints)
    return [out[e.id] for e in endpoints]


def test_scores_follow_the_fixed_proximity_curve() -> None:
    assert _scores(_scorer(), _request(_ep(0, PEER))) == [1.0, 0.2, 0.05, 0.02, 0.0, 0.0]


def test_all_zero_without_peer_or_peer_topology() -> None:
    assert _scores(_scorer(), _request(None)) == [0.0] * 6
    assert _scores(_scorer(), _request(_ep(0, None))) == [0.0] * 6


def test_empty_fields_never_match() -> None:
    peer = _ep(0, Topology(zone="z1"))
    endpoints = [_ep(1, Topology()), _ep(2, Topology(zone="z1", hostname=""))]
    out = _scorer().score(make_cycle(), _request(peer), endpoints)
    assert [out[e.id] for e in endpoints] == [0.0, 0.05]


def test_reads_named_producer_only() -> None:
    other = topology_key("topo-b")
    peer = _ep(0, PEER, other)
    endpoints = [_ep(1, PEER, other), _ep(2, PEER, KEY)]
    out = _scorer("topo-b").score(make_cycle(), _request(peer), endpoints)
    assert [out[e.id] for e in endpoints] == [1.0, 0.0]


def test_is_an_alpha_affinity_scorer_and_passes_the_contract_kit() -> None:
    scorer = _scorer()
    assert isinstance(scorer, Scorer)
    assert scorer.category is ScorerCategory.AFFINITY
    assert TopologyAffinityScorer.STABILITY is Stability.ALPHA
    for n in (0, 1, 7, 50):
        endpoints = [
            _ep(i, Topology(hostname=f"h{i % 4}", zone=e.labels["zone"]))
            for i, e in enumerate(sample_endpoints(n, seed=n))
        ]
        check_scorer(scorer, endpoints, _request(endpoints[0] if endpoints else None))
