"""Builders for flow-control tests: plugins by type, a controllable pool and a flow controller.

Saturation is steered through real endpoint metrics: with the ``utilization-detector`` defaults an
endpoint with KV-cache use ``0.8 * s`` has saturation ``s``. Metrics are stamped at the handle's
current time, so they never go stale unless a test says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from epp.config.loader import ensure_eviction_defaults, ensure_flow_defaults
from epp.config.schema import FlowControlSpec
from epp.flowcontrol.controller import FlowController
from epp.flowcontrol.shared import CrossReplicaOptions
from epp.plugin import Endpoint, InferenceRequest, SaturationDetector
from epp.plugin.params import decode
from epp.plugins.flow.admitter import ProbabilisticAdmitter
from epp.plugins.flow.concurrency import ConcurrencyDetector
from epp.plugins.flow.eviction import PriorityThenTimeEvictionOrderPolicy
from epp.plugins.flow.fairness import GlobalStrictFairnessPolicy, RoundRobinFairnessPolicy
from epp.plugins.flow.ordering import (
    EDFOrderingPolicy,
    FCFSOrderingPolicy,
    SLODeadlineOrderingPolicy,
)
from epp.plugins.flow.program_aware import ProgramAwareFairness
from epp.plugins.flow.turn_priority import TurnPriority
from epp.plugins.flow.usage_limits import (
    PriorityHoldbackPolicy,
    SoftReflectiveCeilingPolicy,
    StaticUsageLimitPolicy,
)
from epp.plugins.flow.utilization import UtilizationDetector
from filters.sheddable_eviction import SheddableEvictionFilter
from tests.builders import FakeHandle, make_endpoint, make_request

PLUGIN_CLASSES: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        FCFSOrderingPolicy,
        EDFOrderingPolicy,
        SLODeadlineOrderingPolicy,
        GlobalStrictFairnessPolicy,
        RoundRobinFairnessPolicy,
        ProgramAwareFairness,
        StaticUsageLimitPolicy,
        PriorityHoldbackPolicy,
        SoftReflectiveCeilingPolicy,
        ConcurrencyDetector,
        UtilizationDetector,
        ProbabilisticAdmitter,
        TurnPriority,
        SheddableEvictionFilter,
        PriorityThenTimeEvictionOrderPolicy,
    )
}


def build_plugin(h: FakeHandle, type_name: str, name: str = "", **params: Any) -> Any:
    cls = PLUGIN_CLASSES[type_name]
    return cls(name=name or type_name, params=decode(cls.Params, params), handle=h)


@dataclass
class Pool:
    """A pool whose saturation (under utilization-detector defaults) is ``saturation``."""

    handle: FakeHandle
    saturation: float = 0.0
    size: int = 1

    def endpoints(self) -> Sequence[Endpoint]:
        kv = 0.8 * self.saturation
        return [make_endpoint(i, kv=kv, update_time=self.handle.now) for i in range(self.size)]


@dataclass
class Env:
    """A flow controller under test with its clock, pool, plugins and metrics registry."""

    handle: FakeHandle
    pool: Pool
    plugins: dict[str, Any]
    controller: FlowController
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def advance(self, seconds: float) -> None:
        self.handle.now += seconds

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


def make_env(
    flow_control: str | Mapping[str, Any] | None = None,
    *,
    plugins: Sequence[tuple[str, str, Mapping[str, Any]]] = (),
    detector: str = "utilization-detector",
    pool_size: int = 1,
    cross_replica: CrossReplicaOptions | None = None,
    built: Mapping[str, Any] | None = None,
) -> Env:
    """``flow_control`` is the ``flowControl`` YAML section; ``plugins`` are extra
    ``(type, name, parameters)`` instances, ``built`` extra instances by name."""
    h = FakeHandle()
    registry = h.registry
    instances: dict[str, Any] = dict(built or {})
    for type_name, name, params in plugins:
        instances[name or type_name] = build_plugin(h, type_name, name, **params)

    def add(type_name: str) -> Any:
        inst = instances[type_name] = build_plugin(h, type_name)
        return inst

    ensure_flow_defaults(add, instances)
    raw = yaml.safe_load(flow_control) if isinstance(flow_control, str) else flow_control
    spec = decode(FlowControlSpec, raw) if raw is not None else None
    if spec is not None and spec.enable_eviction:
        ensure_eviction_defaults(add, instances)
    det: SaturationDetector = instances.get(detector) or add(detector)
    controller = FlowController.from_config(
        spec,
        plugins=instances,
        detector=det,
        registry=registry,
        clock=h.clock,
        pool_name="pool",
        cross_replica=cross_replica,
    )
    return Env(h, Pool(h, size=pool_size), instances, controller, registry)


def request(
    rid: str = "req-0",
    *,
    priority: int = 0,
    fairness: str = "default-flow",
    size: int = 100,
    headers: Mapping[str, str] | None = None,
    **kw: Any,
) -> InferenceRequest:
    return make_request(
        request_id=rid,
        priority=priority,
        fairness_id=fairness,
        size_bytes=size,
        headers=dict(headers or {}),
        **kw,
    )
