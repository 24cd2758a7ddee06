"""Endpoint topology: where an endpoint runs, and how close two endpoints are.

``topology-extractor`` publishes a ``Topology`` on each endpoint under ``TOPOLOGY.key(<its
name>)`` (default ``Topology/topology-extractor``), read from the endpoint's labels; it publishes
nothing for an endpoint without any of the labels. ``topology-affinity-filter`` and
``topology-affinity-scorer`` compare candidates with the peer endpoint, the pick of an earlier
disaggregation stage that ``disagg-profile-handler`` publishes as the request attribute
``epp.plugin.roles.PEER_ENDPOINT`` (``peer_topology``).

Levels run from tightest to loosest: ``host`` < ``rack`` < ``zone`` < ``region`` < ``none``; the
same host implies the same rack, zone and region. ``compare`` returns the tightest level at which
both endpoints have the same non-empty value; an empty value never matches, not even another empty
one, so an endpoint missing a field is never co-located on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

from epp.plugin.attributes import endpoint_attribute
from epp.plugin.keys import DataKey, DataType
from epp.plugin.roles import PEER_ENDPOINT
from epp.plugin.types import Endpoint, InferenceRequest

TOPOLOGY_EXTRACTOR: Final = "topology-extractor"
"""Type, and default instance name, of the producer of ``Topology``."""


@dataclass(frozen=True, slots=True)
class Topology:
    """The locality of an endpoint; ``""`` = unknown."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""

    @property
    def empty(self) -> bool:
        return not (self.hostname or self.rack or self.zone or self.region)


TOPOLOGY: Final[DataType[Topology]] = DataType("Topology")


def topology_key(producer: str = "") -> DataKey[Topology]:
    """Where the ``topology-extractor`` named ``producer`` (default: the default name)
    publishes."""
    return TOPOLOGY.key(producer or TOPOLOGY_EXTRACTOR)


class TopologyLevel(enum.IntEnum):
    """A topology tier, tightest first; ``NONE`` = nothing in common."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4

    @property
    def label(self) -> str:
        """The config-facing name (``host``, ..., ``none``)."""
        return self.name.lower()


LEVEL_NAMES: Final = ("host", "rack", "zone", "region")
"""The levels a configuration may name."""


def parse_level(name: str) -> TopologyLevel:
    """The level called ``name`` (``host``, ``rack``, ``zone`` or ``region``); ValueError else."""
    if name not in LEVEL_NAMES:
        raise ValueError(
            f"invalid topology level {name!r}, must be one of {', '.join(LEVEL_NAMES)}"
        )
    return TopologyLevel[name.upper()]


def compare(peer: Topology | None, candidate: Topology | None) -> TopologyLevel:
    """The tightest level at which both share a non-empty, equal value (``NONE`` when either is
    None or nothing matches)."""
    if peer is None or candidate is None:
        return TopologyLevel.NONE
    if _same(peer.hostname, candidate.hostname):
        return TopologyLevel.HOST
    if _same(peer.rack, candidate.rack):
        return TopologyLevel.RACK
    if _same(peer.zone, candidate.zone):
        return TopologyLevel.ZONE
    if _same(peer.region, candidate.region):
        return TopologyLevel.REGION
    return TopologyLevel.NONE


def _same(a: str, b: str) -> bool:
    return a != "" and a == b


def endpoint_topology(endpoint: Endpoint, key: DataKey[Topology]) -> Topology | None:
    """The non-empty ``Topology`` published on ``endpoint`` under ``key``, or None."""
    value = endpoint_attribute(endpoint, key)
    if not isinstance(value, Topology) or value.empty:
        return None
    return value


def peer_topology(request: InferenceRequest, key: DataKey[Topology]) -> Topology | None:
    """The topology of the peer endpoint of ``request`` (``PEER_ENDPOINT``), or None when there is
    no peer or it has no topology."""
    peer = PEER_ENDPOINT.get(request)
    if not isinstance(peer, Endpoint):
        return None
    return endpoint_topology(peer, key)
