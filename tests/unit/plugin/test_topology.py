from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import Metrics, Topology
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.topology import (
    TopologyLevel,
    compare,
    parse_level,
    peer_topology,
    topology_key,
)
from tests.builders import make_endpoint, make_request

KEY = topology_key()
FULL = Topology(hostname="h1", rack="r1", zone="z1", region="eu")


@pytest.mark.parametrize(
    ("candidate", "expected"),
    [
        pytest.param(FULL, TopologyLevel.HOST, id="same-host"),
        pytest.param(dataclasses.replace(FULL, hostname="h2"), TopologyLevel.RACK, id="rack"),
        pytest.param(Topology("h2", "r2", "z1", "eu"), TopologyLevel.ZONE, id="zone"),
        pytest.param(Topology("h2", "r2", "z2", "eu"), TopologyLevel.REGION, id="region"),
        pytest.param(Topology("h2", "r2", "z2", "us"), TopologyLevel.NONE, id="none"),
        pytest.param(None, TopologyLevel.NONE, id="missing"),
    ],
)
def test_compare_returns_tightest_shared_level(
    candidate: Topology | None, expected: TopologyLevel
) -> None:
    assert compare(FULL, candidate) is expected


def test_compare_never_matches_empty_fields() -> None:
    assert compare(Topology(zone="z1"), Topology(zone="z1")) is TopologyLevel.ZONE
    assert compare(Topology(zone="z1"), Topology(hostname="h1")) is TopologyLevel.NONE
    assert compare(Topology(region="r"), Topology(region="")) is TopologyLevel.NONE


def test_parse_level_accepts_config_names_and_rejects_others() -> None:
    assert [parse_level(n) for n in ("host", "rack", "zone", "region")] == list(TopologyLevel)[:4]
    with pytest.raises(ValueError, match="must be one of host, rack, zone, region"):
        parse_level("none")


def test_topology_key_defaults_to_extractor_type() -> None:
    assert topology_key() == "Topology/topology-extractor"
    assert topology_key("topo-b") == "Topology/topo-b"


def test_peer_topology_reads_peer_endpoint_attribute() -> None:
    peer = dataclasses.replace(make_endpoint(0), metrics=Metrics(attributes={KEY: FULL}))
    request = make_request()
    assert peer_topology(request, KEY) is None
    PEER_ENDPOINT.put(request, peer)
    assert peer_topology(request, KEY) == FULL
    assert peer_topology(request, topology_key("other")) is None


def test_peer_topology_ignores_empty_topology_and_peer_without_metrics() -> None:
    request = make_request()
    empty = dataclasses.replace(make_endpoint(0), metrics=Metrics(attributes={KEY: Topology()}))
    PEER_ENDPOINT.put(request, empty)
    assert peer_topology(request, KEY) is None
    PEER_ENDPOINT.put(request, dataclasses.replace(make_endpoint(0), metrics=None))
    assert peer_topology(request, KEY) is None
