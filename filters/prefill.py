"""``prefill-filter``: keep the endpoints that can prefill.

Keeps an endpoint whose pod label ``llm-d.ai/role`` is ``prefill``, ``encode-prefill``,
``prefill-decode``, ``both`` (deprecated alias of ``prefill-decode``) or
``encode-prefill-decode``. An endpoint without the label is dropped (an unlabeled pod is a decode
pod), as are unknown and empty values. Upstream's by-label filter for the prefill role
(``allowsNoLabel: false``). When no endpoint is left the profile has no result, and the
``disagg-profile-handler`` serves the request decode-only.

Parameters: none.

YAML::

    plugins:
      - type: prefill-filter
    schedulingProfiles:
      - name: prefill
        plugins:
          - pluginRef: prefill-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin.roles import PREFILL_ROLES
from filters._role import RoleFilter


class PrefillFilter(RoleFilter):
    TYPE: ClassVar[str] = "prefill-filter"
    ROLES: ClassVar[frozenset[str]] = PREFILL_ROLES
