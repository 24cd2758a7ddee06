"""``topology-affinity-filter`` (alpha): in a later disaggregation stage, keep the candidates
co-located with the endpoint an earlier stage picked.

``disagg-profile-handler`` picks the decode endpoint first and publishes it as the request
attribute ``peer-endpoint`` (``epp.plugin.roles.PEER_ENDPOINT``) before it runs the ``prefill``
profile. In that profile this filter keeps the candidates whose ``Topology`` (published by
``topology-extractor``, see ``epp.plugin.topology``) shares at least ``minAffinity`` with the
peer's: ``host`` keeps the same host only, ``rack`` the same host or rack, then ``zone``, then
``region``. A candidate without a ``Topology`` is dropped, and an empty field never matches, not
even against an empty one.

It never makes a request unroutable (fail open): with no peer, a peer without a ``Topology``, or
no candidate close enough, every candidate passes.

Parameters:

* ``minAffinity``: ``host`` (default), ``rack``, ``zone`` or ``region``;
* ``topologyProducerName``: the ``topology-extractor`` instance to read; default
  ``topology-extractor``.

``minAffinity: host`` assumes a host is the NVLink boundary (8-GPU HGX/DGX boards). On rack-scale
NVLink domains (NVL72) use ``rack``, with the extractor's ``rack`` label naming the NVLink domain.

YAML example::

    plugins:
    - type: topology-extractor
    - type: topology-affinity-filter
      name: prefill-near-decode
      parameters:
        minAffinity: rack
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: prefill-filter
      - pluginRef: prefill-near-decode
      - pluginRef: max-score-picker
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, Handle, InferenceRequest, PluginBase, Stability
from epp.plugin.topology import (
    compare,
    endpoint_topology,
    parse_level,
    peer_topology,
    topology_key,
)


class TopologyAffinityFilter(PluginBase):
    TYPE: ClassVar[str] = "topology-affinity-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        min_affinity: str = "host"
        topology_producer_name: str = ""

        def __post_init__(self) -> None:
            parse_level(self.min_affinity or "host")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.min_affinity = parse_level(params.min_affinity or "host")
        self.key = topology_key(params.topology_producer_name)

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        peer = peer_topology(request, self.key)
        if peer is None:
            return endpoints
        kept = [
            ep
            for ep in endpoints
            if (mine := endpoint_topology(ep, self.key)) is not None
            and compare(peer, mine) <= self.min_affinity
        ]
        return kept or endpoints
