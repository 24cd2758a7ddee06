"""``multicluster-prefix-cache-scorer`` (alpha): ``prefix-cache-scorer`` for a cluster-scoped
EPP, whose candidates are clusters (``epp.plugins.sources.multicluster``).

With clusters as endpoints, the prefix index of the producer it reads already records which
cluster each prompt's blocks went to, so a repeated prefix goes back to the cluster that served
it: the scorer is ``prefix-cache-scorer`` under another type name, with the same formula and
parameters (see ``scorers.prefix_cache``). It reads the match info of
``prefixMatchInfoProducerName`` (default ``approx-prefix-cache-producer``, created when no config
declares it); to read a ``multicluster-approx-prefix-cache-producer``, name it there.

YAML::

    plugins:
    - type: multicluster-approx-prefix-cache-producer
    - type: multicluster-prefix-cache-scorer
      parameters:
        prefixMatchInfoProducerName: multicluster-approx-prefix-cache-producer
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: multicluster-prefix-cache-scorer
        weight: 2
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import Stability
from scorers.prefix_cache import PrefixCacheScorer


class MultiClusterPrefixCacheScorer(PrefixCacheScorer):
    TYPE: ClassVar[str] = "multicluster-prefix-cache-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
