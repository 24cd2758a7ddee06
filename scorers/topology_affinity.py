"""``topology-affinity-scorer`` (alpha): in a later disaggregation stage, prefer candidates close
to the endpoint an earlier stage picked (category Affinity).

``disagg-profile-handler`` publishes the decode pick as the request attribute ``peer-endpoint``
(``epp.plugin.roles.PEER_ENDPOINT``) before it runs the ``prefill`` profile. This scorer grades
each candidate by the tightest topology level it shares with that peer (``Topology`` from
``topology-extractor``, see ``epp.plugin.topology``), on a fixed curve shaped by the bandwidth a
KV-cache transfer gets at that distance:

=========  =====  ============================
level      score  transfer path
=========  =====  ============================
host       1.00   NVLink
rack       0.20   one NIC and one switch
zone       0.05   several switch hops
region     0.02   between data centres
none       0.00
=========  =====  ============================

Every candidate scores 0 when there is no peer or the peer has no ``Topology``; a candidate
without a ``Topology`` scores 0; an empty field never matches, not even against an empty one.

Parameters: ``topologyProducerName``, the ``topology-extractor`` instance to read (default
``topology-extractor``).

YAML example::

    plugins:
    - type: topology-extractor
    - type: topology-affinity-scorer
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: topology-affinity-scorer
        weight: 1
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
)
from epp.plugin.topology import (
    TopologyLevel,
    compare,
    endpoint_topology,
    peer_topology,
    topology_key,
)

LEVEL_SCORES: Final[Mapping[TopologyLevel, float]] = {
    TopologyLevel.HOST: 1.00,
    TopologyLevel.RACK: 0.20,
    TopologyLevel.ZONE: 0.05,
    TopologyLevel.REGION: 0.02,
    TopologyLevel.NONE: 0.00,
}


class TopologyAffinityScorer(PluginBase):
    TYPE: ClassVar[str] = "topology-affinity-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        topology_producer_name: str = ""

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.key = topology_key(params.topology_producer_name)

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        peer = peer_topology(request, self.key)
        if peer is None:
            return dict.fromkeys((ep.id for ep in endpoints), 0.0)
        return {
            ep.id: LEVEL_SCORES[compare(peer, endpoint_topology(ep, self.key))] for ep in endpoints
        }
