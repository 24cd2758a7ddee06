"""Two-phase configuration loader.

Phase 1 parses the YAML strictly into ``EndpointPickerConfig``. Phase 2 instantiates the declared
plugins (only their types are imported), applies upstream's system defaults (spec §3.3) and wires
the result into a ``Pipeline``: the profiles, the profile handler, the parsers, the hooks for each
extension point and the data-layer pipelines. Every error names what is wrong and where.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from epp.config.builder import Builder, PluginFactory
from epp.config.errors import ConfigError
from epp.config.pipeline import KubeNotifications, Pipeline
from epp.config.profiles import build_profiles, profile_handler
from epp.config.schema import (
    API_VERSIONS,
    DEFAULT_CONFIG_TEXT,
    DEFAULT_EVICTION_FILTER,
    DEFAULT_EVICTION_ORDERING,
    DEFAULT_POLICY_TYPES,
    DEPRECATED_API_VERSION,
    FEATURE_GATES,
    KIND,
    EndpointPickerConfig,
)
from epp.datalayer.collector import DataPipeline, NotificationPipeline, SourcePipeline
from epp.plugin import (
    AttributeNeeds,
    AttributePublisher,
    Consumer,
    DataProducer,
    DataSource,
    Discovery,
    EndpointExtractor,
    EndpointSource,
    Extractor,
    Handle,
    Parser,
    ReplicaSyncer,
    SaturationDetector,
)
from epp.plugin.conformance import refusals
from epp.plugin.flow import EvictionFilterPolicy, EvictionOrderingPolicy
from epp.plugin.notifications import NotificationExtractor, NotificationSource
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.units import parse_duration
from epp.state.sync import DEFAULT_INTERVAL

log = logging.getLogger(__name__)

__all__ = ["ConfigError", "LoadOptions", "PluginFactory", "load_config", "parse_config"]

DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")
# Data type consumed → type of the producer auto-created when nothing produces it (spec §3.3.9).
DEFAULT_PRODUCERS = {
    "PrefixCacheMatchInfo": "approx-prefix-cache-producer",
    "TokenizedPrompt": "token-producer",
    "InFlightLoad": "inflight-load-producer",
    # upstream's name of the SessionID data type (attrsession.SessionIDDataKey)
    "SessionIDDataKey": "session-id-producer",
    "MultiModalEncoderCacheMatchInfoKey": "mm-embeddings-cache-producer",
    "LatencyPredictionInfo": "predicted-latency-producer",
}


# A metrics source of one of these types stands for the injected default: with a cluster-scoped
# source (the endpoints are clusters), scraping each gateway as a pod would read nonsense.
_SCRAPERS = ("metrics-data-source", "multicluster-metrics-data-source")


@dataclass
class LoadOptions:
    allow_experimental: bool = False


def parse_config(text: str) -> EndpointPickerConfig:
    """Phase 1: YAML text → strict ``EndpointPickerConfig``."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError("config must be a YAML mapping (an EndpointPickerConfig object)")
    try:
        cfg: EndpointPickerConfig = decode(EndpointPickerConfig, raw)
    except ParamError as exc:
        raise ConfigError(f"config: {exc}") from None
    if cfg.api_version not in API_VERSIONS:
        raise ConfigError(
            f"config: apiVersion: unsupported {cfg.api_version!r} (want {API_VERSIONS[0]})"
        )
    if cfg.api_version == DEPRECATED_API_VERSION:
        log.warning("apiVersion %s is deprecated; use %s", cfg.api_version, API_VERSIONS[0])
    if cfg.kind != KIND:
        raise ConfigError(f"config: kind: expected {KIND!r}, got {cfg.kind!r}")
    return cfg


def parse_feature_gates(gates: tuple[str, ...]) -> dict[str, bool]:
    result = dict(FEATURE_GATES)
    for i, gate in enumerate(gates):
        name, sep, value = gate.partition("=")
        name = name.strip()
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES))
            raise ConfigError(f"config: featureGates[{i}]: unknown gate {name!r} (known: {known})")
        if sep and value.strip().lower() not in ("true", "false"):
            raise ConfigError(f"config: featureGates[{i}]: value must be true or false")
        result[name] = not sep or value.strip().lower() == "true"
    return result


@functools.cache
def _builtin_default() -> EndpointPickerConfig:
    return parse_config(DEFAULT_CONFIG_TEXT)


def ensure_flow_defaults(add: Callable[[str], Any], instances: Mapping[str, Any]) -> None:
    """Instantiate the default flow-control policies that are not declared (spec §3.3.5)."""
    for type_name in DEFAULT_POLICY_TYPES:
        if type_name not in instances:
            add(type_name)


def ensure_eviction_defaults(add: Callable[[str], Any], instances: Mapping[str, Any]) -> None:
    """``flowControl.enableEviction``: the default eviction filter and ordering policies, each
    unless the config declares a plugin of that role (upstream's runner builds these two)."""
    for role, type_name in (
        (EvictionFilterPolicy, DEFAULT_EVICTION_FILTER),
        (EvictionOrderingPolicy, DEFAULT_EVICTION_ORDERING),
    ):
        if not any(isinstance(p, role) for p in instances.values()):
            add(type_name)


def load_config(
    text: str | None,
    *,
    registry: PluginRegistry,
    handle_for: Callable[[], Handle],
    options: LoadOptions | None = None,
) -> Pipeline:
    """Parse ``text`` (``None`` = the built-in default config) and build the pipeline."""
    cfg = parse_config(DEFAULT_CONFIG_TEXT if text is None else text)
    gates = parse_feature_gates(cfg.feature_gates)
    opts = options or LoadOptions()
    b = Builder(registry, handle_for, opts.allow_experimental)
    for i, spec in enumerate(cfg.plugins):
        if not spec.type:
            raise ConfigError(f"config: plugins[{i}].type: required")
        b.add(spec.type, spec.name, spec.parameters)

    profiles = build_profiles(b, cfg.scheduling_profiles, _builtin_default())
    handler = profile_handler(b, profiles)
    parsers = _parsers(b, cfg)
    detector = _saturation_detector(b, cfg)
    ensure_flow_defaults(b.add, b.instances)  # spec §3.3.5, whether or not the gate is on
    if cfg.flow_control is not None and cfg.flow_control.enable_eviction:
        ensure_eviction_defaults(lambda t: b.add(t, system=True), b.instances)
    sources, discovery = _data_layer(b, cfg)
    notifications = _kube_notifications(b, cfg)
    _check_attribute_needs(b, sources)
    syncer, sync_interval = _cross_replica(b, cfg)
    _auto_producers(b)
    _check_declarations(b)
    return Pipeline.assemble(
        instances=b.instances,
        profiles=profiles,
        profile_handler=handler,
        parsers=parsers,
        saturation_detector=detector,
        sources=sources,
        discovery=discovery,
        feature_gates=gates,
        flow_control=cfg.flow_control,
        config=cfg,
        syncer=syncer,
        sync_interval=sync_interval,
        kube_notifications=notifications,
    )


def _parsers(b: Builder, cfg: EndpointPickerConfig) -> list[Parser]:
    refs = [r.plugin_ref for r in cfg.request_handler.parsers] if cfg.request_handler else []
    if not refs and cfg.parser is not None:
        refs = [cfg.parser.plugin_ref]
    if not refs:
        declared = [p.typed_name.name for p in b.of(Parser)]
        refs = declared or list(DEFAULT_PARSERS)
    parsers = []
    for i, name in enumerate(refs):
        inst = b.ref(name, f"requestHandler.parsers[{i}]")
        if not isinstance(inst, Parser):
            raise ConfigError(f"config: requestHandler.parsers[{i}]: {name!r} is not a parser")
        parsers.append(inst)
    return parsers


def _saturation_detector(b: Builder, cfg: EndpointPickerConfig) -> SaturationDetector:
    ref = None
    if cfg.flow_control and cfg.flow_control.saturation_detector:
        ref = cfg.flow_control.saturation_detector.plugin_ref
    elif cfg.saturation_detector:
        ref = cfg.saturation_detector.plugin_ref
    if ref is None:
        declared = b.of(SaturationDetector)
        inst = declared[0] if declared else b.ensure("utilization-detector")
    else:
        inst = b.ref(ref, "flowControl.saturationDetector")
    if not isinstance(inst, SaturationDetector):
        raise ConfigError(f"config: saturationDetector: {ref!r} is not a saturation detector")
    return inst


def _data_layer(
    b: Builder, cfg: EndpointPickerConfig
) -> tuple[list[DataPipeline], Discovery | None]:
    dl = cfg.data_layer
    sources: list[DataPipeline] = []
    for i, spec in enumerate(dl.sources if dl else ()):
        src = b.ref(spec.plugin_ref, f"dataLayer.sources[{i}]")
        if isinstance(src, NotificationSource):
            continue  # watched in Kubernetes mode (_kube_notifications)
        if isinstance(src, EndpointSource):
            refs = [r.plugin_ref for r in spec.extractors]
            sources.append(NotificationPipeline(src, _endpoint_extractors(b, refs, i)))
            continue
        if not isinstance(src, DataSource):
            raise ConfigError(f"config: dataLayer.sources[{i}]: {spec.plugin_ref!r} is no source")
        exts = []
        for j, ref in enumerate(spec.extractors):
            ext = b.ref(ref.plugin_ref, f"dataLayer.sources[{i}].extractors[{j}]")
            if not isinstance(ext, Extractor):
                raise ConfigError(
                    f"config: dataLayer.sources[{i}].extractors[{j}]: {ref.plugin_ref!r} "
                    "is not an extractor"
                )
            exts.append(ext)
        sources.append(SourcePipeline.of(src, exts))
    _attach_unlisted_extractors(b, sources)
    inject = dl.inject_defaults if dl else True
    if inject and not any(s.source.typed_name.type in _SCRAPERS for s in sources):
        src = b.ensure("metrics-data-source")
        sources.append(SourcePipeline.of(src, [b.ensure("core-metrics-extractor")]))
    discovery = None
    if dl and dl.discovery:
        discovery = b.ref(dl.discovery.plugin_ref, "dataLayer.discovery")
        if not isinstance(discovery, Discovery):
            raise ConfigError(
                f"config: dataLayer.discovery: {dl.discovery.plugin_ref!r} is not "
                "a discovery plugin"
            )
    return sources, discovery


def _cross_replica(b: Builder, cfg: EndpointPickerConfig) -> tuple[ReplicaSyncer | None, float]:
    """The cross-replica syncer and the sync interval (seconds) of ``dataLayer``.

    ``crossReplicaSyncInterval`` is a Go duration; absent or not positive it is 200 ms, as
    upstream. ``peerDiscovery`` is accepted and ignored: replicas meet through the syncer's log.
    """
    dl = cfg.data_layer
    if dl is None:
        return None, DEFAULT_INTERVAL
    if dl.peer_discovery is not None:
        log.info(
            "dataLayer.peerDiscovery (%s) is ignored: replicas share state through "
            "dataLayer.crossReplicaSyncerPluginRef",
            dl.peer_discovery.plugin_ref,
        )
    try:
        interval = parse_duration(dl.cross_replica_sync_interval or "0")
    except ValueError as exc:
        raise ConfigError(f"config: dataLayer.crossReplicaSyncInterval: {exc}") from None
    if interval <= 0:
        interval = DEFAULT_INTERVAL
    ref = dl.cross_replica_syncer_plugin_ref
    if not ref:
        return None, interval
    syncer = b.ref(ref, "dataLayer.crossReplicaSyncerPluginRef")
    if not isinstance(syncer, ReplicaSyncer):
        raise ConfigError(
            f"config: dataLayer.crossReplicaSyncerPluginRef: {ref!r} is not a cross-replica "
            f"syncer (type {syncer.typed_name.type!r}; e.g. redis-syncer)"
        )
    return syncer, interval


def _kube_notifications(b: Builder, cfg: EndpointPickerConfig) -> list[KubeNotifications]:
    """The ``k8s-notification-source`` entries of ``dataLayer.sources`` with their extractors,
    each of which must hear notifications (a type at most once per source, as upstream)."""
    out: list[KubeNotifications] = []
    for i, spec in enumerate(cfg.data_layer.sources if cfg.data_layer else ()):
        src = b.ref(spec.plugin_ref, f"dataLayer.sources[{i}]")
        if not isinstance(src, NotificationSource):
            continue
        extractors: list[NotificationExtractor] = []
        for j, ref in enumerate(spec.extractors):
            where = f"dataLayer.sources[{i}].extractors[{j}]"
            ext = b.ref(ref.plugin_ref, where)
            if not isinstance(ext, NotificationExtractor):
                raise ConfigError(
                    f"config: {where}: {ref.plugin_ref!r} does not hear Kubernetes notifications "
                    f"(type {ext.typed_name.type!r} is not a notification extractor)"
                )
            if any(e.typed_name.type == ext.typed_name.type for e in extractors):
                raise ConfigError(
                    f"config: {where}: duplicate extractor type {ext.typed_name.type!r} "
                    "for the same source"
                )
            extractors.append(ext)
        out.append(KubeNotifications(src, tuple(extractors)))
    return out


def _endpoint_extractors(b: Builder, refs: list[str], i: int) -> list[EndpointExtractor]:
    """The extractors of the endpoint-notification source ``dataLayer.sources[i]``: each must
    hear endpoint events, and a type may appear once (upstream's rule)."""
    extractors: list[EndpointExtractor] = []
    types: set[str] = set()
    for j, ref in enumerate(refs):
        where = f"dataLayer.sources[{i}].extractors[{j}]"
        ext = b.ref(ref, where)
        if not isinstance(ext, EndpointExtractor):
            raise ConfigError(
                f"config: {where}: {ref!r} does not hear endpoint events "
                f"(type {ext.typed_name.type!r} is not an endpoint extractor)"
            )
        if ext.typed_name.type in types:
            raise ConfigError(
                f"config: {where}: duplicate extractor type {ext.typed_name.type!r} "
                "for the same source"
            )
        types.add(ext.typed_name.type)
        extractors.append(ext)
    return extractors


def _attach_unlisted_extractors(b: Builder, sources: list[DataPipeline]) -> None:
    """A declared plugin that only hears endpoint events (``topology-extractor``) and is listed
    under no source is attached to an ``endpoint-notification-source``, as upstream does."""
    listed = {id(e) for p in sources for e in p.extractors}
    unlisted = [
        p
        for p in b.of(EndpointExtractor)
        if id(p) not in listed and not isinstance(p, (DataProducer, DataSource, EndpointSource))
    ]
    if not unlisted:
        return
    for i, pipeline in enumerate(sources):
        if isinstance(pipeline, NotificationPipeline):
            sources[i] = pipeline._replace(extractors=(*pipeline.extractors, *unlisted))
            return
    source = b.ensure("endpoint-notification-source")
    sources.append(NotificationPipeline(source, tuple(unlisted)))


def _check_attribute_needs(b: Builder, sources: list[DataPipeline]) -> None:
    """Every endpoint attribute a plugin needs (``AttributeNeeds``) is published by an extractor
    of a configured source (``AttributePublisher``), as upstream refuses a multicluster scorer
    without its metrics extractor."""
    published = {
        key
        for pipeline in sources
        for extractor in pipeline.extractors
        if isinstance(extractor, AttributePublisher)
        for key in extractor.published_attributes()
    }
    for name, inst in b.instances.items():
        if not isinstance(inst, AttributeNeeds):
            continue
        for key in sorted(inst.required_attributes() - published):
            producer = key.partition("/")[2]
            raise ConfigError(
                f"config: plugin {name!r}: needs the endpoint attribute {key!r}, which no "
                f"extractor under dataLayer.sources publishes (configure a {producer} under "
                "a source)"
            )


def _check_declarations(b: Builder) -> None:
    """Every plugin declares what its roles require (``epp.plugin.conformance``, the definition
    the contract kit applies too): e.g. a producer's keys are ``<data type>/<its name>``."""
    for name, inst in b.instances.items():
        for role, wrong in refusals(inst).items():
            raise ConfigError(f"config: plugin {name!r}: refused as a {role}: {'; '.join(wrong)}")


def _auto_producers(b: Builder) -> None:
    """Create the default producer for every consumed key that nothing produces (spec §3.3.9)."""
    for _ in range(8):  # producers may consume keys themselves; the chain is short
        produced = {k for p in b.of(DataProducer) for k in p.produces()}
        missing = [key for p in list(b.of(Consumer)) for key in p.consumes() if key not in produced]
        if not missing:
            return
        added = False
        unavailable = []
        for key in missing:
            data_type, _, producer = key.partition("/")
            producer_type = DEFAULT_PRODUCERS.get(data_type)
            is_default = producer_type is not None and producer in ("", producer_type)
            if producer_type is not None and is_default and producer_type in b.registry:
                if producer_type not in b.instances:
                    b.add(producer_type)
                    added = True
            elif is_default:
                unavailable.append(key)
            elif producer not in b.instances:
                raise ConfigError(f"config: data key {key!r} is consumed but nothing produces it")
        if not added:
            for key in unavailable:
                log.warning(
                    "no producer available for data key %s; its consumers will see no data", key
                )
            return
