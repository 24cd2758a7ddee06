"""Wire constants of the Endpoint Picker Protocol and llm-d's control headers (spec §1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

DESTINATION_HEADER: Final = "x-gateway-destination-endpoint"
SERVED_HEADER: Final = "x-gateway-destination-endpoint-served"
SCORES_KEY: Final = "x-gateway-destination-endpoint-scores"
SUBSET_KEY: Final = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE: Final = "envoy.lb"
SUBSET_NAMESPACE: Final = "envoy.lb.subset_hint"
DROPPED_REASON_HEADER: Final = "x-llm-d-request-dropped-reason"
REQUEST_ID_HEADER: Final = "x-request-id"
WENT_INTO_RESP_HEADERS: Final = "x-went-into-resp-headers"
MAX_BODY_CHUNK: Final = 62_000
PREFER_HEADER: Final = "prefer"
PREFER_IF_AVAILABLE: Final = "if-available"
"""``Prefer: if-available`` (RFC 7240) marks a conditional decode: route to a decode worker only
if it already caches the prompt (at least partly), else answer 412 (``prefers_if_available``)."""

FAIRNESS_HEADERS: Final = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
OBJECTIVE_HEADERS: Final = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
MODEL_REWRITE_HEADERS: Final = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")

# Headers the EPP owns on the way upstream. A client-supplied value is removed (remove_headers),
# not merely left unechoed: otherwise a client could steer Envoy's original-dst routing or the
# P/D sidecar. Upstream only overwrites them when it happens to set the same key.
OWNED_REQUEST_HEADERS: Final = (
    DESTINATION_HEADER,
    SERVED_HEADER,
    "x-prefiller-host-port",
    "x-encoder-hosts-ports",
    "x-data-parallel-host-port",
    "x-kv-cache-source-host-port",
    DROPPED_REASON_HEADER,
)


def first_header(headers: Mapping[str, str], names: tuple[str, ...]) -> str:
    """Value of the first present header among ``names`` (new name first, then aliases)."""
    for name in names:
        value = headers.get(name)
        if value:
            return value
    return ""


def prefers_if_available(headers: Mapping[str, str]) -> bool:
    """The ``prefer`` header holds the ``if-available`` preference: one of its comma-separated
    tokens is ``if-available`` (any case, surrounding spaces and ``;`` parameters ignored)."""
    value = headers.get(PREFER_HEADER)
    if not value:
        return False
    for preference in value.split(","):
        if preference.partition(";")[0].strip().lower() == PREFER_IF_AVAILABLE:
            return True
    return False


def subset_hint(metadata: Mapping[str, Any]) -> list[str] | None:
    """The data plane's subset hint, or ``None`` when absent (spec §1.5).

    Only a list counts (a string is ignored, as upstream). An empty list is returned as such and
    means "no endpoint is eligible".
    """
    ns = metadata.get(SUBSET_NAMESPACE)
    if not isinstance(ns, Mapping):
        return None
    value = ns.get(SUBSET_KEY)
    if not isinstance(value, list):
        return None
    return [str(v) for v in value]


def host_of(entry: str) -> str:
    """IP part of ``ip:port`` / ``[v6]:port`` / bare ``ip`` (subset matching is by IP only)."""
    entry = entry.strip()
    if entry.startswith("["):
        return entry[1:].split("]", 1)[0]
    if entry.count(":") == 1:
        return entry.rsplit(":", 1)[0]
    return entry
