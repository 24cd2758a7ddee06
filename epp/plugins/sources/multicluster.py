"""The data layer of a cluster-scoped EPP, whose endpoints are whole clusters (alpha, upstream's
multi-cluster variants): ``multicluster-file-discovery``, ``multicluster-metrics-data-source`` and
``multicluster-metrics-extractor``.

A cluster-scoped EPP routes each request to one of several clusters: each endpoint is a cluster's
gateway (its Envoy), where that cluster's own EPP picks a pod. The multicluster scorers
(``multicluster-kv-cache-utilization-scorer``, ``multicluster-queue-scorer``) compare clusters by
their pool aggregates, which every EPP exports on its metrics port
(``llm_d_epp_average_kv_cache_utilization``, ``llm_d_epp_average_queue_size``).

``multicluster-file-discovery`` is ``file-discovery`` (same file, same ``path``, ``watchFile``
and ``pollInterval``) whose ``address`` may also be a host name (a DNS-1123 subdomain), since a
cluster's gateway may be reached by either. Two labels of an entry say where the cluster's
metrics are, when not at its gateway: ``metricsAddress`` (an IP or host name) and
``metricsPort`` (default: the entry's port)::

    endpoints:
    - name: cluster-a
      address: gw.cluster-a.example.com
      port: "443"
      labels: {metricsAddress: epp.cluster-a.example.com, metricsPort: "9090"}

``multicluster-metrics-data-source`` is ``metrics-data-source`` for clusters: it scrapes
``<scheme>://<metricsAddress or address>:<metricsPort or port, or the port parameter>/metrics``.
A cross-cluster scrape crosses a trust boundary, so the defaults differ: ``scheme: https`` with
the peer's certificate verified (``insecureSkipVerify: false``; ``caCertPath`` for a private CA,
``clientCertPath``/``clientKeyPath`` for mTLS), and a page is read up to 8 MiB. A refused scrape
does not take a cluster out of routing (the metrics port need not be the gateway).

``multicluster-metrics-extractor`` reads a cluster's page and publishes, on the cluster
endpoint, ``MultiClusterKVCacheUtilization/multicluster-metrics-extractor`` and
``MultiClusterQueueSize/multicluster-metrics-extractor``
(``epp.plugin.attributes.MULTICLUSTER_KV_CACHE_UTILIZATION`` and ``MULTICLUSTER_QUEUE_SIZE``).
Parameters: ``kvCacheUtilizationMetric`` (default ``llm_d_epp_average_kv_cache_utilization``)
and ``queueSizeMetric`` (default ``llm_d_epp_average_queue_size``), each a metric spec
``name{label=value,...}`` (the latest matching series is read). A page with neither fails the
extraction (counted in ``llm_d_epp_datalayer_extract_errors_total``); a metric missing from a
page removes its attribute, so a cluster is never scored on a stale aggregate. The scorers need
this extractor: a config with one of them and no extractor publishing its attribute under
``dataLayer.sources`` stops at startup, as upstream.

YAML (upstream's example)::

    plugins:
    - type: multicluster-file-discovery
      name: discovery
      parameters: {path: /etc/epp/clusters.yaml}
    - type: multicluster-metrics-data-source
      name: metrics-source
      parameters: {scheme: https, caCertPath: /etc/epp/tls/ca.crt}
    - type: multicluster-metrics-extractor
      name: metrics-extractor
    - type: multicluster-session-affinity-filter
      name: session-affinity
    - type: multicluster-kv-cache-utilization-scorer
      name: kv-cache
    - type: multicluster-queue-scorer
      name: queue
    - type: max-score-picker
    - type: single-profile-handler
    dataLayer:
      discovery: {pluginRef: discovery}
      sources:
      - pluginRef: metrics-source
        extractors: [{pluginRef: metrics-extractor}]

Difference from upstream: upstream's discovery resolves the metrics labels into the endpoint's
metrics host; here the source reads them (an endpoint has no metrics host of its own). With a
multicluster source configured the EPP adds no pod ``metrics-data-source`` of its own (upstream
adds one, which scrapes each gateway's ``/metrics`` as if it were a pod).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

from epp.plugin import (
    MULTICLUSTER_KV_CACHE_UTILIZATION,
    MULTICLUSTER_QUEUE_SIZE,
    DataKey,
    Endpoint,
    Handle,
    Metrics,
    PluginBase,
    Stability,
    with_attribute,
)
from epp.plugin.units import parse_duration
from epp.plugins.sources import promtext
from epp.plugins.sources.engines import MetricSpec, parse_spec
from epp.plugins.sources.file_discovery import FileDiscovery, is_host_name, is_ip
from epp.plugins.sources.metrics import MetricsDataSource

METRICS_ADDRESS_LABEL: Final = "metricsAddress"
METRICS_PORT_LABEL: Final = "metricsPort"
DEFAULT_KV_METRIC: Final = "llm_d_epp_average_kv_cache_utilization"
DEFAULT_QUEUE_METRIC: Final = "llm_d_epp_average_queue_size"


class MultiClusterFileDiscovery(FileDiscovery):
    """``file-discovery`` whose endpoints are clusters, reached by IP or host name."""

    TYPE: ClassVar[str] = "multicluster-file-discovery"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    HOST_NAMES: ClassVar[bool] = True


class MultiClusterMetricsDataSource(MetricsDataSource):
    """Scrapes each cluster's metrics, where its labels say, over verified TLS by default."""

    TYPE: ClassVar[str] = "multicluster-metrics-data-source"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    MAX_PAYLOAD: ClassVar[int] = 8 << 20

    @dataclass(frozen=True)
    class Params:
        scheme: Literal["http", "https"] = "https"
        path: str = "/metrics"
        insecure_skip_verify: bool = False
        port: int = 0
        interval: str = ""
        ca_cert_path: str = ""
        client_cert_path: str = ""
        client_key_path: str = ""

        def __post_init__(self) -> None:
            if not 0 <= self.port <= 65535:
                raise ValueError(f"port must be between 0 and 65535, got {self.port}")
            if not self.path.startswith("/"):
                raise ValueError(f"path must start with '/', got {self.path!r}")
            if self.interval and parse_duration(self.interval) < 0:
                raise ValueError(f"interval must not be negative, got {self.interval!r}")
            if bool(self.client_cert_path) != bool(self.client_key_path):
                raise ValueError("clientCertPath and clientKeyPath must be set together")

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.reaches_endpoint = False

    def target(self, endpoint: Endpoint) -> tuple[str, int]:
        labels = endpoint.labels
        address = labels.get(METRICS_ADDRESS_LABEL) or endpoint.address
        if not (is_ip(address) or is_host_name(address)):
            raise ValueError(f"{endpoint.id}: label {METRICS_ADDRESS_LABEL}={address!r} is no host")
        port = labels.get(METRICS_PORT_LABEL)
        if not port:
            return address, self.params.port or endpoint.port
        if not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"{endpoint.id}: label {METRICS_PORT_LABEL}={port!r} is no port")
        return address, int(port)


class MultiClusterMetricsExtractor(PluginBase):
    """A cluster's pool aggregates → ``MultiClusterKVCacheUtilization`` and
    ``MultiClusterQueueSize`` attributes."""

    TYPE: ClassVar[str] = "multicluster-metrics-extractor"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        kv_cache_utilization_metric: str = ""
        queue_size_metric: str = ""

        def __post_init__(self) -> None:
            for field_name, text in (
                ("kvCacheUtilizationMetric", self.kv_cache_utilization_metric),
                ("queueSizeMetric", self.queue_size_metric),
            ):
                try:
                    parse_spec(text)
                except ValueError as exc:
                    raise ValueError(f"{field_name}: {exc}") from None

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        kv = parse_spec(params.kv_cache_utilization_metric or DEFAULT_KV_METRIC)
        queue = parse_spec(params.queue_size_metric or DEFAULT_QUEUE_METRIC)
        assert kv is not None and queue is not None  # never empty
        self._specs: tuple[tuple[DataKey[float], MetricSpec], ...] = (
            (MULTICLUSTER_KV_CACHE_UTILIZATION, kv),
            (MULTICLUSTER_QUEUE_SIZE, queue),
        )
        self._wanted = frozenset(spec.name for _, spec in self._specs)

    def published_attributes(self) -> frozenset[str]:
        return frozenset(key for key, _ in self._specs)

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics:
        families = promtext.parse(payload, self._wanted)
        values = [(key, latest(spec, families)) for key, spec in self._specs]
        if all(value is None for _, value in values):
            names = ", ".join(str(spec) for _, spec in self._specs)
            raise ValueError(f"no pool metrics in the page of {endpoint.id} (looked for {names})")
        metrics = previous
        for key, value in values:
            metrics = with_attribute(metrics, key, value)
        return metrics


def latest(spec: MetricSpec, families: promtext.Families) -> float | None:
    """The finite value of the matching series with the greatest timestamp (the last one on ties
    or without timestamps), as upstream's ``getLatestMetric``."""
    best: promtext.Sample | None = None
    best_ts = -1
    for sample in families.get(spec.name, ()):
        ts = -1 if sample.timestamp_ms is None else sample.timestamp_ms
        if spec.matches(sample) and ts >= best_ts:
            best, best_ts = sample, ts
    if best is None or not math.isfinite(best.value):
        return None
    return best.value
