"""``flowControl`` (``FlowControlSpec``) resolved against the configured plugin instances.

Defaults (spec §8): ``defaultRequestTTL`` 60s (``0s`` disables the queue-wait budget);
``noEndpointRequestTTL`` follows ``defaultRequestTTL``; global ``maxRequests``/``maxBytes``
unlimited when omitted or 0; per band ``maxRequests`` 5000 and ``maxBytes`` 1G (``0`` = default);
per band ``fairnessPolicyRef`` ``global-strict-fairness-policy`` and ``orderingPolicyRef``
``fcfs-ordering-policy``; ``usageLimitPolicyPluginRef`` ``static-usage-limit-policy``. Band 0
always exists. A priority with no configured band gets one built from ``defaultPriorityBand`` (or,
below zero, ``defaultNegativePriorityBand`` when set) the first time a request needs it.
Quantities accept Kubernetes strings (``"1Gi"``, ``"5k"``), durations Go strings (``"30s"``).
With ``enableEviction`` the eviction filter and ordering policies are the configured plugins of
those roles (``epp.plugin.flow``; the loader adds ``sheddable-eviction-filter`` and
``priority-then-time-eviction-order-policy`` when none is declared); two of one role is an error.

YAML::

    featureGates: [flowControl]
    plugins:
      - type: round-robin-fairness-policy
      - {type: priority-holdback-policy, name: holdback, parameters: {minCeiling: 0.5}}
    flowControl:
      defaultRequestTTL: 30s
      noEndpointRequestTTL: 2m          # scale-from-zero waiting room
      maxRequests: 20000                # global cap over all bands (default: none)
      priorityBands:
        - {priority: 10, maxRequests: "200", fairnessPolicyRef: round-robin-fairness-policy}
      defaultNegativePriorityBand: {maxRequests: "10"}
      usageLimitPolicyPluginRef: holdback
      enableEviction: true
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from epp.config.schema import (
    DEFAULT_FAIRNESS,
    DEFAULT_ORDERING,
    DEFAULT_USAGE_LIMIT,
    BandTemplateSpec,
    FlowControlSpec,
    PriorityBandSpec,
)
from epp.flowcontrol.queues import BandConfig
from epp.plugin.flow import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    PriorityAdjuster,
    UsageLimitPolicy,
)
from epp.plugin.units import parse_duration, parse_quantity

DEFAULT_REQUEST_TTL: Final = 60.0
DEFAULT_BAND_MAX_REQUESTS: Final = 5000
DEFAULT_BAND_MAX_BYTES: Final = 1_000_000_000


class FlowControlConfigError(ValueError):
    """The ``flowControl`` section cannot be used; the message names the field."""


@dataclass(frozen=True)
class FlowControlConfig:
    default_ttl: float
    no_endpoint_ttl: float
    max_requests: int
    max_bytes: int
    bands: Mapping[int, BandConfig]
    default_band: BandConfig
    negative_band: BandConfig
    usage_limit: UsageLimitPolicy
    enable_eviction: bool = False
    adjusters: tuple[PriorityAdjuster, ...] = field(default=())
    eviction: tuple[EvictionFilterPolicy, EvictionOrderingPolicy] | None = None
    """With ``enable_eviction``: the eviction filter and ordering policies."""

    def template(self, priority: int) -> BandConfig:
        return self.negative_band if priority < 0 else self.default_band


def resolve_config(spec: FlowControlSpec | None, plugins: Mapping[str, Any]) -> FlowControlConfig:
    spec = spec or FlowControlSpec()
    ordering: OrderingPolicy = _plugin(
        plugins, DEFAULT_ORDERING, OrderingPolicy, "an ordering policy", "default"
    )
    fairness: FairnessPolicy = _plugin(
        plugins, DEFAULT_FAIRNESS, FairnessPolicy, "a fairness policy", "default"
    )
    base = BandConfig(DEFAULT_BAND_MAX_REQUESTS, DEFAULT_BAND_MAX_BYTES, fairness, ordering)
    default_band = _band(spec.default_priority_band, base, plugins, "defaultPriorityBand")
    negative_band = (
        _band(spec.default_negative_priority_band, base, plugins, "defaultNegativePriorityBand")
        if spec.default_negative_priority_band is not None
        else default_band
    )
    bands: dict[int, BandConfig] = {}
    for i, band in enumerate(spec.priority_bands):
        where = f"priorityBands[{i}]"
        if band.priority in bands:
            raise FlowControlConfigError(
                f"flowControl.{where}.priority: duplicate priority {band.priority}"
            )
        bands[band.priority] = _band(band, base, plugins, where)
    default_ttl = _duration(spec.default_request_ttl, DEFAULT_REQUEST_TTL, "defaultRequestTTL")
    usage_ref = spec.usage_limit_policy_plugin_ref or DEFAULT_USAGE_LIMIT
    return FlowControlConfig(
        default_ttl=default_ttl,
        no_endpoint_ttl=_duration(
            spec.no_endpoint_request_ttl, default_ttl, "noEndpointRequestTTL"
        ),
        max_requests=_quantity(spec.max_requests, "maxRequests"),
        max_bytes=_quantity(spec.max_bytes, "maxBytes"),
        bands=bands,
        default_band=default_band,
        negative_band=negative_band,
        usage_limit=_plugin(
            plugins,
            usage_ref,
            UsageLimitPolicy,
            "a usage-limit policy",
            "usageLimitPolicyPluginRef",
        ),
        enable_eviction=spec.enable_eviction,
        adjusters=tuple(p for p in plugins.values() if isinstance(p, PriorityAdjuster)),
        eviction=_eviction_policies(plugins) if spec.enable_eviction else None,
    )


def _eviction_policies(
    plugins: Mapping[str, Any],
) -> tuple[EvictionFilterPolicy, EvictionOrderingPolicy]:
    found = []
    for role, what in (
        (EvictionFilterPolicy, "eviction filter policy"),
        (EvictionOrderingPolicy, "eviction ordering policy"),
    ):
        names = [name for name, p in plugins.items() if isinstance(p, role)]
        if len(names) != 1:
            raise FlowControlConfigError(
                f"flowControl.enableEviction: needs exactly one {what}, "
                f"got {len(names)}{': ' + ', '.join(names) if names else ''}"
            )
        found.append(plugins[names[0]])
    return found[0], found[1]


def _band(
    spec: PriorityBandSpec | BandTemplateSpec | None,
    base: BandConfig,
    plugins: Mapping[str, Any],
    where: str,
) -> BandConfig:
    if spec is None:
        return base
    max_requests = _quantity(spec.max_requests, f"{where}.maxRequests") or base.max_requests
    max_bytes = _quantity(spec.max_bytes, f"{where}.maxBytes") or base.max_bytes
    fairness = base.fairness
    if spec.fairness_policy_ref:
        fairness = _plugin(
            plugins,
            spec.fairness_policy_ref,
            FairnessPolicy,
            "a fairness policy",
            f"{where}.fairnessPolicyRef",
        )
    ordering = base.ordering
    if spec.ordering_policy_ref:
        ordering = _plugin(
            plugins,
            spec.ordering_policy_ref,
            OrderingPolicy,
            "an ordering policy",
            f"{where}.orderingPolicyRef",
        )
    return BandConfig(max_requests, max_bytes, fairness, ordering)


def _plugin(plugins: Mapping[str, Any], name: str, role: type, what: str, where: str) -> Any:
    inst = plugins.get(name)
    if inst is None:
        raise FlowControlConfigError(
            f"flowControl.{where}: no plugin named {name!r} (declare it under plugins, "
            "or let the loader add the flow-control defaults)"
        )
    if not isinstance(inst, role):
        raise FlowControlConfigError(f"flowControl.{where}: plugin {name!r} is not {what}")
    return inst


def _quantity(value: str | int | None, where: str) -> int:
    if value is None or value == "":
        return 0
    try:
        result = parse_quantity(value)
    except ValueError as exc:
        raise FlowControlConfigError(f"flowControl.{where}: {exc}") from None
    if result < 0:
        raise FlowControlConfigError(f"flowControl.{where}: must be >= 0, got {value!r}")
    return result


def _duration(value: str, default: float, where: str) -> float:
    if not value:
        return default
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise FlowControlConfigError(f"flowControl.{where}: {exc}") from None
    if seconds < 0:
        raise FlowControlConfigError(f"flowControl.{where}: must be >= 0, got {value!r}")
    return seconds
