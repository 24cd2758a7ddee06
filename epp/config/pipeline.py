"""The wired result of a configuration: every plugin instance slotted into the roles it fills.

Roles and capabilities are detected once here, so the request path never calls ``isinstance``.
"""

from __future__ import annotations

import graphlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from epp.config.schema import EndpointPickerConfig, FlowControlSpec
from epp.datalayer.collector import DataPipeline
from epp.plugin import (
    DEFAULT_PRODUCE_TIMEOUT,
    Admitter,
    Consumer,
    DataProducer,
    Discovery,
    Lifecycle,
    Parser,
    PreRequest,
    ProducerTimeout,
    Profile,
    ProfileHandler,
    ReadinessChecker,
    ReplicaSyncer,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseHeaders,
    ResponseStreaming,
    SaturationDetector,
    Screener,
    SharedState,
    StateDumper,
)
from epp.plugin.notifications import NotificationExtractor, NotificationSource
from epp.state.sync import DEFAULT_INTERVAL


class KubeNotifications(NamedTuple):
    """A ``k8s-notification-source`` and the extractors listed under it."""

    source: NotificationSource
    extractors: tuple[NotificationExtractor, ...]


@dataclass
class Pipeline:
    instances: dict[str, Any]
    profiles: dict[str, Profile]
    profile_handler: ProfileHandler
    parsers: list[Parser]
    saturation_detector: SaturationDetector
    sources: list[DataPipeline]
    """Polled sources and endpoint-notification sources, in configuration order."""
    discovery: Discovery | None
    feature_gates: dict[str, bool]
    flow_control: FlowControlSpec | None
    config: EndpointPickerConfig
    producers: list[DataProducer] = field(default_factory=list)
    producer_timeouts: list[float] = field(default_factory=list)
    """Each producer's budget in seconds, in ``producers`` order."""
    request_header: list[RequestHeaderProcessor] = field(default_factory=list)
    """RequestHeader processors, in configuration order."""
    screeners: list[Screener] = field(default_factory=list)
    """Screeners, in configuration order (each sees the same candidates; the order is only that
    of their calls)."""
    admitters: list[Admitter] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_headers: list[ResponseHeaders] = field(default_factory=list)
    response_streaming: list[ResponseStreaming] = field(default_factory=list)
    """ResponseStreaming hooks, run on every response body chunk."""
    response_complete: list[ResponseComplete] = field(default_factory=list)
    lifecycle: list[Lifecycle] = field(default_factory=list)
    readiness: list[ReadinessChecker] = field(default_factory=list)
    dumpers: list[StateDumper] = field(default_factory=list)
    syncer: ReplicaSyncer | None = None
    """``dataLayer.crossReplicaSyncerPluginRef``: the transport of cross-replica state."""
    sync_interval: float = DEFAULT_INTERVAL
    """``dataLayer.crossReplicaSyncInterval`` in seconds."""
    shared: list[SharedState] = field(default_factory=list)
    """Plugins whose routing facts are shared with the other replicas (with a syncer)."""
    kube_notifications: list[KubeNotifications] = field(default_factory=list)
    """Kubernetes object notification sources (watched in Kubernetes mode, ``epp.k8s``)."""

    @classmethod
    def assemble(cls, **kw: Any) -> Pipeline:
        p = cls(**kw)
        everything = list(p.instances.values())
        p.producers = _producer_order([x for x in everything if isinstance(x, DataProducer)])
        p.producer_timeouts = [
            float(x.produce_timeout())
            if isinstance(x, ProducerTimeout)
            else DEFAULT_PRODUCE_TIMEOUT
            for x in p.producers
        ]
        p.request_header = [x for x in everything if isinstance(x, RequestHeaderProcessor)]
        p.screeners = [x for x in everything if isinstance(x, Screener)]
        p.admitters = [x for x in everything if isinstance(x, Admitter)]
        p.pre_request = [x for x in everything if isinstance(x, PreRequest)]
        p.response_headers = [x for x in everything if isinstance(x, ResponseHeaders)]
        p.response_streaming = [x for x in everything if isinstance(x, ResponseStreaming)]
        p.response_complete = [x for x in everything if isinstance(x, ResponseComplete)]
        p.lifecycle = [x for x in everything if isinstance(x, Lifecycle)]
        p.readiness = [x for x in everything if isinstance(x, ReadinessChecker)]
        p.dumpers = [x for x in everything if isinstance(x, StateDumper)]
        p.shared = [x for x in everything if isinstance(x, SharedState)]
        return p

    def describe(self) -> dict[str, Any]:
        """The effective configuration, for logs and the admin view."""
        return {
            "plugins": {n: p.typed_name.type for n, p in self.instances.items()},
            "profiles": {
                name: {
                    "filters": [str(f.typed_name) for f in prof.filters],
                    "scorers": [[str(s.typed_name), w] for s, w in prof.scorers],
                    "picker": str(prof.picker.typed_name),
                }
                for name, prof in self.profiles.items()
            },
            "profileHandler": str(self.profile_handler.typed_name),
            "parsers": [str(p.typed_name) for p in self.parsers],
            "saturationDetector": str(self.saturation_detector.typed_name),
            "producers": [str(p.typed_name) for p in self.producers],
            "requestHeaderProcessors": [str(p.typed_name) for p in self.request_header],
            "screeners": [str(p.typed_name) for p in self.screeners],
            "featureGates": self.feature_gates,
            **(
                {
                    "crossReplicaSyncer": str(self.syncer.typed_name),
                    "sharedState": [str(p.typed_name) for p in self.shared],
                }
                if self.syncer is not None
                else {}
            ),
        }


def _producer_order(producers: list[DataProducer]) -> list[DataProducer]:
    """Producers in data-dependency order (a producer consuming another's key runs after it)."""
    by_key = {key: p for p in producers for key in p.produces()}
    graph: dict[int, set[int]] = {}
    index = {id(p): p for p in producers}
    for p in producers:
        needed = p.consumes() if isinstance(p, Consumer) else frozenset()
        graph[id(p)] = {id(by_key[k]) for k in needed if k in by_key and by_key[k] is not p}
    return [index[i] for i in graphlib.TopologicalSorter(graph).static_order()]
