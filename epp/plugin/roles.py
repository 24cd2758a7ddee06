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
On a traced request it records upstream's ``prepare_disaggregation`` span: ``llm_d.epp.pd.*``
(``disaggregation_used``, ``reason`` or ``prefill_pod_address`` / ``prefill_pod_port``),
``llm_d.epp.encode.*`` (``disaggregation_used``, ``reason`` or ``endpoints``), ``gen_ai.*`` and
``mm.*`` (``epp.plugin.spans``).
"""

from __future__ import annotations

import time
from typing import Any, Final

from epp.plugin.keys import DataKey
from epp.plugin.spans import request_span_attributes, request_spans
from epp.plugin.types import Endpoint, InferenceRequest, ProfileResult, SchedulingResult

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
    start = time.time_ns()
    headers = request.upstream_headers
    headers.pop(PREFILLER_HEADER, None)
    headers.pop(ENCODERS_HEADER, None)
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.targets:
        headers[PREFILLER_HEADER] = prefill.targets[0].hostport
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.targets:
        headers[ENCODERS_HEADER] = ",".join(ep.hostport for ep in encode.targets)
    spans = request_spans(request)
    if spans is not None:
        attributes = request_span_attributes(request) | _disagg_attributes(prefill, encode)
        spans.add_span("prepare_disaggregation", start, time.time_ns(), attributes)


def _disagg_attributes(
    prefill: ProfileResult | None, encode: ProfileResult | None
) -> dict[str, Any]:
    """Upstream's ``llm_d.epp.pd.*`` and ``llm_d.epp.encode.*`` span attributes."""
    out: dict[str, Any] = {}
    if prefill is None or not prefill.targets:
        out["llm_d.epp.pd.disaggregation_used"] = False
        missing = "result" if prefill is None else "target_endpoints"
        out["llm_d.epp.pd.reason"] = f"no_prefill_profile_{missing}"
    else:
        target = prefill.targets[0]
        out["llm_d.epp.pd.disaggregation_used"] = True
        out["llm_d.epp.pd.prefill_pod_address"] = target.address
        out["llm_d.epp.pd.prefill_pod_port"] = str(target.port)
    if encode is None or not encode.targets:
        out["llm_d.epp.encode.disaggregation_used"] = False
        missing = "result" if encode is None else "target_endpoints"
        out["llm_d.epp.encode.reason"] = f"no_encode_profile_{missing}"
    else:
        out["llm_d.epp.encode.disaggregation_used"] = True
        out["llm_d.epp.encode.endpoints"] = ",".join(ep.hostport for ep in encode.targets)
    return out
