"""Disaggregated serving: endpoint roles (the ``llm-d.ai/role`` label, as upstream reads it), the
peer-endpoint request attribute and the headers that tell the P/D sidecar where to go.

A pod serves the stages its role names: ``prefill``, ``decode`` and ``encode`` alone, or several
together (``prefill-decode`` and its deprecated alias ``both``, ``encode-prefill``,
``encode-prefill-decode``). An unlabeled pod is a decode pod (aggregated serving), never a prefill
or encode pod; an unknown role serves nothing.

``role_of`` reads a missing label and an empty one alike (``""``), as upstream's flow control
does. The role filters (``decode-filter``, ...) are upstream's by-label filters and tell them
apart: a pod whose label is present but empty is not "unlabeled" and serves no stage
(``serves``).

``write_disagg_headers`` is upstream's disaggregation PreRequest, shared by the
``disagg-profile-handler`` and the deprecated ``disagg-headers-handler``: it writes
``x-prefiller-host-port`` and ``x-encoder-hosts-ports`` into ``InferenceRequest.upstream_headers``.
"""

from __future__ import annotations

from typing import Final

from epp.plugin.keys import DataKey
from epp.plugin.types import Endpoint, InferenceRequest, SchedulingResult

ROLE_LABEL: Final = "llm-d.ai/role"

DECODE_ROLES: Final = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode", ""})
"""Roles that decode; ``""`` is an unlabeled pod."""
PREFILL_ROLES: Final = frozenset(
    {"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}
)
ENCODE_ROLES: Final = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})

PEER_ENDPOINT: Final[DataKey[Endpoint]] = DataKey("peer-endpoint", "disagg-profile-handler")
"""Request attribute the ``disagg-profile-handler`` publishes before a later stage runs: the
endpoint an earlier stage picked (the decode pick before prefill in ``decode-first`` order, the
prefill pick before decode in ``prefill-first``), for plugins of that later profile to compare
candidates against (e.g. topology affinity)."""

PREFILLER_HEADER: Final = "x-prefiller-host-port"
"""Request header for the decode pod's sidecar: ``ip:port`` of the chosen prefill pod."""
ENCODERS_HEADER: Final = "x-encoder-hosts-ports"
"""Request header for the decode pod's sidecar: comma-separated ``ip:port`` of the encode pods."""


def role_of(endpoint: Endpoint) -> str:
    """The endpoint's role label, ``""`` when it has none."""
    return endpoint.labels.get(ROLE_LABEL, "")


def serves(endpoint: Endpoint, roles: frozenset[str]) -> bool:
    """Whether a role filter over ``roles`` keeps ``endpoint`` (upstream's by-label test): an
    unlabeled endpoint when ``""`` is in ``roles``, a labelled one when its non-empty value is."""
    role = endpoint.labels.get(ROLE_LABEL)
    if role is None:
        return "" in roles
    return role != "" and role in roles


def write_disagg_headers(
    request: InferenceRequest,
    result: SchedulingResult,
    *,
    prefill_profile: str,
    encode_profile: str,
) -> None:
    """Set the sidecar headers of ``request`` from a scheduling result (upstream's disagg
    PreRequest): ``x-prefiller-host-port`` is the first target of ``prefill_profile``,
    ``x-encoder-hosts-ports`` every target of ``encode_profile``. Earlier values are removed first,
    so a stage that did not run, or picked nothing, leaves no header."""
    headers = request.upstream_headers
    headers.pop(PREFILLER_HEADER, None)
    headers.pop(ENCODERS_HEADER, None)
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.targets:
        headers[PREFILLER_HEADER] = prefill.targets[0].hostport
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.targets:
        headers[ENCODERS_HEADER] = ",".join(ep.hostport for ep in encode.targets)
