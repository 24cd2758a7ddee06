"""Endpoint roles in disaggregated serving: the ``llm-d.ai/role`` label, as upstream reads it.

A pod serves the stages its role names: ``prefill``, ``decode`` and ``encode`` alone, or several
together (``prefill-decode`` and its alias ``both``, ``encode-prefill``,
``encode-prefill-decode``). An unlabeled pod is a decode pod (aggregated serving), never a prefill
or encode pod; an unknown role serves nothing.
"""

from __future__ import annotations

from typing import Final

from epp.plugin.types import Endpoint

ROLE_LABEL: Final = "llm-d.ai/role"

DECODE_ROLES: Final = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode", ""})
"""Roles that decode; ``""`` is an unlabeled pod."""
PREFILL_ROLES: Final = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}
)
ENCODE_ROLES: Final = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


def role_of(endpoint: Endpoint) -> str:
    """The endpoint's role label, ``""`` when it has none."""
    return endpoint.labels.get(ROLE_LABEL, "")
