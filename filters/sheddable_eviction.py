"""``sheddable-eviction-filter`` (alpha): only sheddable requests may be evicted in flight.

An eviction filter policy (``epp.plugin.flow.EvictionFilterPolicy``), not a scheduling filter:
with ``flowControl.enableEviction``, flow control asks it at dispatch whether a request may ever
be revoked to free capacity for a gated band. It accepts a request when it is sheddable, priority
< 0 (the project-wide meaning of sheddable, as upstream); requests of priority >= 0 are never
evicted.

It is the eviction filter flow control uses when the config declares none (as upstream's runner
builds it), so declaring it changes nothing; a config may declare another eviction filter policy
instead (at most one).

Parameters: none.

YAML::

    featureGates: [flowControl]
    plugins:
      - type: sheddable-eviction-filter
      - type: priority-then-time-eviction-order-policy
    flowControl:
      enableEviction: true
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import PluginBase, Stability
from epp.plugin.flow import EvictionItem


class SheddableEvictionFilter(PluginBase):
    TYPE: ClassVar[str] = "sheddable-eviction-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    def evictable(self, item: EvictionItem) -> bool:
        return item.priority < 0
