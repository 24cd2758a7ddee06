"""``topology-extractor`` (alpha): stamps each endpoint with its ``Topology``, read from its labels.

For each endpoint the extractor reads four labels and publishes
``Topology(hostname, rack, zone, region)`` under ``Topology/<its name>`` (default
``Topology/topology-extractor``) in ``Metrics.attributes``, where ``topology-affinity-filter`` and
``topology-affinity-scorer`` read it. An endpoint with none of the labels gets no attribute (a
stale one is removed); a missing field stays ``""`` and never matches anything.

Parameters (the label each field is read from; empty = the default):

* ``hostname``: default ``kubernetes.io/hostname``;
* ``rack``: default ``topology.kubernetes.io/rack``;
* ``zone``: default ``topology.kubernetes.io/zone``;
* ``region``: default ``topology.kubernetes.io/region``.

The labels are the endpoint's: in Kubernetes mode the pod's labels, with file discovery the
entry's ``labels``. As upstream, it hears endpoint add/update events: listed under no source, it
is attached to an ``endpoint-notification-source`` on its own, and the topology of an endpoint is
published when it joins or changes. It may also sit under a polled source (its payload is
ignored; the attribute is then refreshed on each scrape)::

    plugins:
    - type: topology-extractor
      parameters:
        rack: example.com/nvlink-domain
    - type: topology-affinity-filter

Difference from upstream: when the hostname label is absent, upstream falls back to the pod's
``spec.hostname`` from a Pod watch; here only labels are read (a ``kubernetes.io/hostname`` label
is what node-level scheduling uses anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import (
    Endpoint,
    EndpointEvent,
    Handle,
    Metrics,
    PluginBase,
    Stability,
    with_attribute,
)
from epp.plugin.topology import Topology, topology_key

DEFAULT_HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
DEFAULT_RACK_LABEL: Final = "topology.kubernetes.io/rack"
DEFAULT_ZONE_LABEL: Final = "topology.kubernetes.io/zone"
DEFAULT_REGION_LABEL: Final = "topology.kubernetes.io/region"


class TopologyExtractor(PluginBase):
    """Endpoint labels → ``Topology`` attribute."""

    TYPE: ClassVar[str] = "topology-extractor"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        hostname: str = ""
        rack: str = ""
        zone: str = ""
        region: str = ""

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.key = topology_key(self.typed_name.name)
        self._labels = (
            params.hostname or DEFAULT_HOSTNAME_LABEL,
            params.rack or DEFAULT_RACK_LABEL,
            params.zone or DEFAULT_ZONE_LABEL,
            params.region or DEFAULT_REGION_LABEL,
        )

    def topology_of(self, labels: Mapping[str, str]) -> Topology | None:
        """The topology the labels describe; None when none of the four labels is set."""
        host, rack, zone, region = (labels.get(name, "") for name in self._labels)
        topology = Topology(hostname=host, rack=rack, zone=zone, region=region)
        return None if topology.empty else topology

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics:
        return with_attribute(previous, self.key, self.topology_of(endpoint.labels))

    def extract_endpoint(self, event: EndpointEvent) -> Mapping[str, Any] | None:
        """``EndpointExtractor``: the topology of an endpoint that joined or changed."""
        topology = self.topology_of(event.endpoint.labels)
        return {str(self.key): topology} if topology is not None else None
