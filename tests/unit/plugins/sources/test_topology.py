from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import Extractor, Metrics, Stability, Topology
from epp.plugin.params import decode
from epp.plugin.topology import topology_key
from epp.plugins.sources.topology import TopologyExtractor
from tests.builders import handle, make_endpoint

STANDARD = {
    "kubernetes.io/hostname": "node-1",
    "topology.kubernetes.io/rack": "rack-a",
    "topology.kubernetes.io/zone": "zone-1",
    "topology.kubernetes.io/region": "eu-west",
}


def _extractor(name: str = "", **params: Any) -> TopologyExtractor:
    return TopologyExtractor(
        name=name, params=decode(TopologyExtractor.Params, params), handle=handle()
    )


def _extract(
    ex: TopologyExtractor, labels: dict[str, str], previous: Metrics | None = None
) -> Metrics:
    endpoint = make_endpoint(0, labels=labels)
    return ex.extract(b"ignored", endpoint, previous or Metrics(), now=5.0)


def test_is_an_alpha_extractor() -> None:
    assert isinstance(_extractor(), Extractor)
    assert TopologyExtractor.STABILITY is Stability.ALPHA


def test_reads_standard_kubernetes_labels_by_default() -> None:
    out = _extract(_extractor(), STANDARD)
    assert out.attributes == {
        "Topology/topology-extractor": Topology("node-1", "rack-a", "zone-1", "eu-west")
    }


def test_configured_label_names_and_instance_name_select_labels_and_key() -> None:
    ex = _extractor("topo", hostname="host", rack="nvl-domain")
    out = _extract(ex, {"host": "h9", "nvl-domain": "nvl-3", **STANDARD})
    assert out.attributes == {topology_key("topo"): Topology("h9", "nvl-3", "zone-1", "eu-west")}


def test_partial_labels_leave_missing_fields_empty() -> None:
    out = _extract(_extractor(), {"topology.kubernetes.io/zone": "zone-2"})
    assert out.attributes[topology_key()] == Topology(zone="zone-2")


def test_no_topology_label_publishes_nothing_and_removes_stale_value() -> None:
    ex = _extractor()
    bare = Metrics(waiting_queue_size=2)
    assert _extract(ex, {"app": "x"}, bare) is bare
    stale = Metrics(attributes={topology_key(): Topology(zone="old")})
    assert _extract(ex, {}, stale).attributes == {}


def test_keeps_other_fields_and_attributes_and_leaves_update_time() -> None:
    previous = Metrics(waiting_queue_size=4, update_time=1.0, attributes={"X/y": 1.0})
    out = _extract(_extractor(), STANDARD, previous)
    assert out.waiting_queue_size == 4
    assert out.update_time == 1.0
    assert out.attributes["X/y"] == 1.0


def test_unchanged_topology_returns_previous_object() -> None:
    ex = _extractor()
    first = _extract(ex, STANDARD)
    assert _extract(ex, STANDARD, first) is first


def test_rejects_unknown_parameter() -> None:
    with pytest.raises(Exception, match="unknown field"):
        decode(TopologyExtractor.Params, {"node": "x"})


def test_extract_does_not_read_payload() -> None:
    ex = _extractor()
    endpoint = dataclasses.replace(make_endpoint(0, labels=STANDARD), metrics=None)
    assert ex.extract(b"\xff not prometheus", endpoint, Metrics(), now=0.0).attributes
