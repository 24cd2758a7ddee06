"""``encode-filter``: keep the endpoints that can encode multimodal inputs.

Keeps an endpoint whose pod label ``llm-d.ai/role`` is ``encode``, ``encode-prefill`` or
``encode-prefill-decode``. An endpoint without the label is dropped, as are unknown and empty
values. Upstream's by-label filter for the encode role (``allowsNoLabel: false``). Encode is the
first stage of the pipeline: encode → prefill → decode.

Parameters: none.

YAML::

    plugins:
      - type: encode-filter
    schedulingProfiles:
      - name: encode
        plugins:
          - pluginRef: encode-filter
"""

from __future__ import annotations

from typing import ClassVar

from epp.plugin.roles import ENCODE_ROLES
from filters._role import RoleFilter


class EncodeFilter(RoleFilter):
    TYPE: ClassVar[str] = "encode-filter"
    ROLES: ClassVar[frozenset[str]] = ENCODE_ROLES
