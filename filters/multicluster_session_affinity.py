"""``multicluster-session-affinity-filter`` (alpha): ``session-affinity-filter`` for a
cluster-scoped EPP, whose candidates are clusters (``epp.plugins.sources.multicluster``).

A session is pinned to the cluster its earlier requests went to, exactly as
``session-affinity-filter`` pins it to an endpoint: a cluster is an endpoint here (its identity
comes from ``multicluster-file-discovery``), so the filter is that one under another type name,
with the same parameters, defaults and strategies (see ``filters.session_affinity``). With the
default ``encoded_endpoint_header`` strategy the response carries the cluster's token for the
client to echo; when that cluster leaves, every candidate passes.

YAML::

    plugins:
    - type: multicluster-session-affinity-filter
      name: session-affinity
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: session-affinity
      - pluginRef: queue
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin import Stability
from filters.session_affinity import SessionAffinityFilter


class MultiClusterSessionAffinityFilter(SessionAffinityFilter):
    TYPE: ClassVar[str] = "multicluster-session-affinity-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
