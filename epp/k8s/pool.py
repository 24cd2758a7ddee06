"""InferencePool (``inference.networking.k8s.io/v1``, spec §7.1) and the endpoint pool it defines.

Only the fields the EPP needs are decoded: ``spec.selector.matchLabels`` (required; pods of the
pool's namespace only), ``spec.targetPorts`` (1 to 8 unique ``{number}`` entries, 1..65535) and
``spec.appProtocol`` (``http`` or ``kubernetes.io/h2c``; absent is kept as "": no constraint on
the parsers, as upstream). ``endpointPickerRef`` and
``status`` belong to the gateway and are ignored.

In standalone mode (``--endpoint-selector``) the same ``EndpointPool`` is built from flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from epp.k8s.meta import POOL_GROUP, DecodeError, integer, mapping, metadata, string_map
from epp.plugin.selectors import LabelSelector

POOL_VERSION: Final = "v1"
POOL_PLURAL: Final = "inferencepools"
APP_PROTOCOLS: Final = ("http", "kubernetes.io/h2c")
MAX_TARGET_PORTS: Final = 8


@dataclass(frozen=True, slots=True)
class EndpointPool:
    """Which pods are endpoints, and on which ports."""

    name: str
    namespace: str
    selector: LabelSelector
    target_ports: tuple[int, ...]
    app_protocol: str = ""
    """``http``, ``kubernetes.io/h2c``, or "" (not declared)."""


def check_target_ports(ports: tuple[int, ...], where: str) -> tuple[int, ...]:
    if not 1 <= len(ports) <= MAX_TARGET_PORTS:
        raise DecodeError(f"{where}: 1 to {MAX_TARGET_PORTS} ports required, got {len(ports)}")
    if len(set(ports)) != len(ports):
        raise DecodeError(f"{where}: ports must be unique, got {list(ports)}")
    return ports


def decode_pool(obj: Any) -> EndpointPool:
    namespace, name, _ = metadata(obj)
    try:
        spec = mapping(obj.get("spec"), "spec")
        selector = mapping(spec.get("selector"), "spec.selector")
        match_labels = string_map(selector.get("matchLabels"), "spec.selector.matchLabels")
        raw_ports = spec.get("targetPorts")
        if not isinstance(raw_ports, list):
            raise DecodeError("spec.targetPorts: required list")
        ports = tuple(
            integer(
                mapping(p, f"spec.targetPorts[{i}]").get("number"), f"targetPorts[{i}]", 1, 65535
            )
            for i, p in enumerate(raw_ports)
        )
        check_target_ports(ports, "spec.targetPorts")
        protocol = spec.get("appProtocol") or ""
        if protocol and protocol not in APP_PROTOCOLS:
            raise DecodeError(f"spec.appProtocol: {protocol!r} is not one of {APP_PROTOCOLS}")
    except DecodeError as exc:
        raise DecodeError(f"InferencePool {namespace}/{name}: {exc}") from None
    return EndpointPool(
        name=name,
        namespace=namespace,
        selector=LabelSelector.from_match_labels(match_labels),
        target_ports=ports,
        app_protocol=protocol,
    )


__all__ = ["POOL_GROUP", "EndpointPool", "check_target_ports", "decode_pool"]
