from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import (
    DataKey,
    Endpoint,
    Filter,
    InferenceRequest,
    Metrics,
    Stability,
    Topology,
    with_attribute,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.testing import check_filter, sample_endpoints
from epp.plugin.topology import topology_key
from filters.topology_affinity import TopologyAffinityFilter
from tests.builders import handle, make_cycle, make_endpoint, make_request

KEY = topology_key()
PEER = Topology(hostname="h1", rack="r1", zone="z1", region="eu")
CANDIDATES = [
    Topology("h1", "r1", "z1", "eu"),  # same host
    Topology("h2", "r1", "z1", "eu"),  # same rack
    Topology("h3", "r2", "z1", "eu"),  # same zone
    Topology("h4", "r3", "z2", "eu"),  # same region
    Topology("h5", "r4", "z3", "us"),  # nothing shared
    None,  # no topology attribute
]


def _ep(i: int, topology: Topology | None, key: DataKey[Topology] = KEY) -> Endpoint:
    return dataclasses.replace(make_endpoint(i), metrics=with_attribute(Metrics(), key, topology))


def _filter(**params: Any) -> TopologyAffinityFilter:
    decoded = decode(TopologyAffinityFilter.Params, params)
    return TopologyAffinityFilter(name="", params=decoded, handle=handle())


def _request(peer: Endpoint | None) -> InferenceRequest:
    request = make_request()
    if peer is not None:
        PEER_ENDPOINT.put(request, peer)
    return request


def _kept(flt: TopologyAffinityFilter, request: InferenceRequest) -> list[int]:
    endpoints = [_ep(i + 1, t) for i, t in enumerate(CANDIDATES)]
    out = flt.filter(make_cycle(), request, endpoints)
    return [endpoints.index(e) for e in out]


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        ("", [0]),
        ("host", [0]),
        ("rack", [0, 1]),
        ("zone", [0, 1, 2]),
        ("region", [0, 1, 2, 3]),
    ],
)
def test_keeps_candidates_within_min_affinity_of_peer(level: str, expected: list[int]) -> None:
    params = {"minAffinity": level} if level else {}
    assert _kept(_filter(**params), _request(_ep(0, PEER))) == expected


def test_fails_open_without_peer_or_peer_topology() -> None:
    everyone = list(range(len(CANDIDATES)))
    assert _kept(_filter(), _request(None)) == everyone
    assert _kept(_filter(), _request(_ep(0, None))) == everyone
    assert _kept(_filter(), _request(_ep(0, Topology()))) == everyone


def test_fails_open_when_no_candidate_is_close_enough() -> None:
    far_peer = _ep(0, Topology("hx", "rx", "zx", "mars"))
    assert _kept(_filter(minAffinity="region"), _request(far_peer)) == list(range(6))


def test_empty_fields_never_match() -> None:
    peer = _ep(0, Topology(zone="z1"))
    endpoints = [_ep(1, Topology(hostname="h1")), _ep(2, Topology(zone="z1"))]
    out = _filter(minAffinity="host").filter(make_cycle(), _request(peer), endpoints)
    assert out == endpoints  # no host match at all: fail open
    out = _filter(minAffinity="zone").filter(make_cycle(), _request(peer), endpoints)
    assert out == [endpoints[1]]


def test_reads_named_producer() -> None:
    other = topology_key("topo-b")
    peer = _ep(0, PEER, other)
    endpoints = [_ep(1, CANDIDATES[1], other), _ep(2, PEER, KEY)]
    out = _filter(minAffinity="rack", topologyProducerName="topo-b").filter(
        make_cycle(), _request(peer), endpoints
    )
    assert out == [endpoints[0]]


def test_rejects_unknown_level() -> None:
    with pytest.raises(ParamError, match="invalid topology level 'node'"):
        decode(TopologyAffinityFilter.Params, {"minAffinity": "node"})


def test_is_an_alpha_filter_and_passes_the_contract_kit() -> None:
    flt = _filter(minAffinity="zone")
    assert isinstance(flt, Filter)
    assert TopologyAffinityFilter.STABILITY is Stability.ALPHA
    for n in (0, 1, 7, 50):
        endpoints = [
            _ep(i, Topology(hostname=f"h{i % 4}", zone=e.labels["zone"]))
            for i, e in enumerate(sample_endpoints(n, seed=n))
        ]
        peer = endpoints[0] if endpoints else None
        check_filter(flt, endpoints, _request(peer))
