"""``decode-filter``: keep the endpoints that can decode.

Keeps an endpoint whose pod label ``llm-d.ai/role`` is ``decode``, ``prefill-decode``, ``both``
(deprecated alias of ``prefill-decode``) or ``encode-prefill-decode``, and every endpoint without
the label: an unlabeled pod serves a request whole (aggregated serving), so a decode profile
still routes when no pod carries a role. A pod labelled with another role (``prefill``,
``encode``, ``encode-prefill``), an unknown value or an empty value is dropped. Upstream's
by-label filter for the decode role (``allowsNoLabel: true``).

Use it in the ``decode`` profile of a ``disagg-profile-handler`` config so a decode pick never
lands on a prefill-only or encode-only pod.

Parameters: none.

YAML::

    plugins:
      - type: decode-filter
    schedulingProfiles:
      - name: decode
        plugins:
          - pluginRef: decode-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin.roles import DECODE_ROLES
from filters._role import RoleFilter


class DecodeFilter(RoleFilter):
    TYPE: ClassVar[str] = "decode-filter"
    ROLES: ClassVar[frozenset[str]] = DECODE_ROLES
