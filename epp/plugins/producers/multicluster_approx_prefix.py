"""``multicluster-approx-prefix-cache-producer`` (alpha): ``approx-prefix-cache-producer`` for a
cluster-scoped EPP, whose candidates are clusters (``epp.plugins.sources.multicluster``).

The approximate prefix index keys each block on the endpoint it was routed to; with clusters as
endpoints it tracks (cluster, block) rather than (pod, block) without any change, so this is that
producer under another type name, with the same parameters and the same published key
``PrefixCacheMatchInfo/<its name>`` (see ``epp.plugins.producers.approx_prefix``). Its metrics
carry this type in their ``plugin_type`` label.

YAML::

    plugins:
    - type: multicluster-approx-prefix-cache-producer
      parameters: {blockSizeTokens: 64}
    - type: multicluster-prefix-cache-scorer
      parameters:
        prefixMatchInfoProducerName: multicluster-approx-prefix-cache-producer
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import Stability
from epp.plugins.producers.approx_prefix import ApproxPrefixCacheProducer


class MultiClusterApproxPrefixCacheProducer(ApproxPrefixCacheProducer):
    TYPE: ClassVar[str] = "multicluster-approx-prefix-cache-producer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
