"""``priority-then-time-eviction-order-policy`` (alpha): which in-flight request is evicted first.

An eviction ordering policy (``epp.plugin.flow.EvictionOrderingPolicy``): with
``flowControl.enableEviction``, among the requests the eviction filter accepted, the lowest
priority goes first; among equal priorities the most recently dispatched, which has the least
KV-cache investment to lose (ties in dispatch time: the later arrival)::

    eviction_key = (priority, -dispatched_at, -seq)      # smallest first

It is the eviction ordering flow control uses when the config declares none (as upstream's
runner builds it), so declaring it changes nothing; a config may declare another eviction
ordering policy instead (at most one).

Parameters: none.

YAML::

    featureGates: [flowControl]
    plugins:
      - type: priority-then-time-eviction-order-policy
    flowControl:
      enableEviction: true
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import PluginBase, Stability
from epp.plugin.flow import EvictionItem


class PriorityThenTimeEvictionOrderPolicy(PluginBase):
    TYPE: ClassVar[str] = "priority-then-time-eviction-order-policy"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    def eviction_key(self, item: EvictionItem) -> tuple[float, ...]:
        return (item.priority, -item.dispatched_at, -item.seq)
