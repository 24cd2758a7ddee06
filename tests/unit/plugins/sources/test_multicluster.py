"""The data layer of a cluster-scoped EPP: ``multicluster-file-discovery`` (host names allowed),
``multicluster-metrics-data-source`` (scrapes where the cluster's labels say, verified TLS by
default) and ``multicluster-metrics-extractor`` (pool aggregates into the attributes the
multicluster scorers read); the loader refuses a multicluster scorer without its extractor and
injects no pod metrics source beside a multicluster one."""

from __future__ import annotations

import asyncio
import ssl
import textwrap
from pathlib import Path
from typing import Any

import pytest

from epp.config.errors import ConfigError
from epp.config.loader import LoadOptions, load_config
from epp.plugin import (
    MULTICLUSTER_KV_CACHE_UTILIZATION,
    MULTICLUSTER_QUEUE_SIZE,
    Endpoint,
    Metrics,
    ReachabilityProbe,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.registry import PluginRegistry
from epp.plugin.testing import (
    check_discovery,
    check_extractor,
    check_plugin_class,
)
from epp.plugins.sources.file_discovery import EndpointsFileError, parse_endpoints
from epp.plugins.sources.multicluster import (
    MultiClusterFileDiscovery,
    MultiClusterMetricsDataSource,
    MultiClusterMetricsExtractor,
)
from tests.builders import FakeHandle, handle, make_endpoint
from tests.conftest import ServerFactory

CLUSTERS = """\
endpoints:
- name: cluster-a
  address: gw.cluster-a.example.com
  port: "443"
  labels: {metricsAddress: epp.cluster-a.example.com, metricsPort: "9090"}
- name: cluster-b
  address: 10.1.0.1
  port: 8080
"""
PAGE = b"""\
# TYPE llm_d_epp_average_kv_cache_utilization gauge
llm_d_epp_average_kv_cache_utilization{name="pool-a"} 0.42
# TYPE llm_d_epp_average_queue_size gauge
llm_d_epp_average_queue_size{name="pool-a"} 2.5
"""


def source(**params: Any) -> MultiClusterMetricsDataSource:
    p = decode(MultiClusterMetricsDataSource.Params, params)
    return MultiClusterMetricsDataSource(name="metrics-source", params=p, handle=handle())


def extractor(**params: Any) -> MultiClusterMetricsExtractor:
    p = decode(MultiClusterMetricsExtractor.Params, params)
    return MultiClusterMetricsExtractor(name="metrics-extractor", params=p, handle=handle())


def cluster(**labels: str) -> Endpoint:
    return Endpoint(
        id="default/cluster-a",
        name="cluster-a",
        namespace="default",
        address="gw.cluster-a.example.com",
        port=443,
        labels=labels,
    )


# ---- discovery --------------------------------------------------------------------------------


def test_clusters_may_be_reached_by_host_name_unlike_pods() -> None:
    clusters = parse_endpoints(CLUSTERS.encode(), hosts=True)
    assert [(c.id, c.hostport) for c in clusters] == [
        ("default/cluster-a", "gw.cluster-a.example.com:443"),
        ("default/cluster-b", "10.1.0.1:8080"),
    ]
    with pytest.raises(EndpointsFileError, match="is not an IP address"):
        parse_endpoints(CLUSTERS.encode())
    bad = CLUSTERS.replace("gw.cluster-a.example.com", "Not A Host!")
    with pytest.raises(EndpointsFileError, match="is not an IP address or a host name"):
        parse_endpoints(bad.encode(), hosts=True)


async def test_the_discovery_publishes_the_clusters(tmp_path: Path) -> None:
    check_plugin_class(MultiClusterFileDiscovery, "multicluster-file-discovery")
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS)
    p = decode(MultiClusterFileDiscovery.Params, {"path": str(path)})
    published = await check_discovery(
        MultiClusterFileDiscovery(name="d", params=p, handle=handle())
    )
    assert [c.address for c in published] == ["gw.cluster-a.example.com", "10.1.0.1"]


# ---- the metrics source -----------------------------------------------------------------------


def test_a_cluster_is_scraped_where_its_labels_say() -> None:
    s = source()
    labelled = cluster(metricsAddress="epp.cluster-a.example.com", metricsPort="9090")
    assert s.url(labelled) == "https://epp.cluster-a.example.com:9090/metrics"
    assert s.url(cluster(metricsAddress="10.0.0.9")) == "https://10.0.0.9:443/metrics"
    assert s.url(cluster()) == "https://gw.cluster-a.example.com:443/metrics"
    assert source(port=9443).url(cluster()) == "https://gw.cluster-a.example.com:9443/metrics"
    for bad in ({"metricsPort": "http"}, {"metricsPort": "70000"}, {"metricsAddress": "a b"}):
        with pytest.raises(ValueError, match="is no"):
            s.target(cluster(**bad))


def test_a_cross_cluster_scrape_verifies_the_peer_by_default() -> None:
    check_plugin_class(MultiClusterMetricsDataSource, "multicluster-metrics-data-source")
    s = source()
    assert isinstance(s._ssl, ssl.SSLContext)
    assert s._ssl.verify_mode is ssl.CERT_REQUIRED and s._ssl.check_hostname
    insecure = source(insecureSkipVerify=True)
    assert isinstance(insecure._ssl, ssl.SSLContext)
    assert insecure._ssl.verify_mode is ssl.CERT_NONE
    assert s.MAX_PAYLOAD == 8 << 20
    assert isinstance(s, ReachabilityProbe) and not s.reaches_endpoint
    with pytest.raises(ParamError, match="clientCertPath and clientKeyPath"):
        decode(MultiClusterMetricsDataSource.Params, {"clientCertPath": "/x"})


async def test_the_source_scrapes_the_metrics_port_of_the_peer(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAGE)
    s = source(scheme="http")
    gateway = Endpoint(
        id="default/cluster-a",
        name="cluster-a",
        namespace="default",
        address="127.0.0.1",
        port=1,  # the gateway: nothing listens here
        labels={"metricsAddress": "127.0.0.1", "metricsPort": str(server.port)},
    )
    try:
        assert await asyncio.wait_for(s.poll(gateway), 10) == PAGE
    finally:
        await s.stop()


# ---- the extractor ----------------------------------------------------------------------------


def test_the_pool_aggregates_become_the_cluster_attributes() -> None:
    check_plugin_class(MultiClusterMetricsExtractor, "multicluster-metrics-extractor")
    e = extractor()
    metrics = check_extractor(e, PAGE, make_endpoint(0))
    assert metrics.attributes[MULTICLUSTER_KV_CACHE_UTILIZATION] == 0.42
    assert metrics.attributes[MULTICLUSTER_QUEUE_SIZE] == 2.5
    assert metrics.update_time == 1000.0  # the endpoint's own scrape time is left alone
    assert e.published_attributes() == {MULTICLUSTER_KV_CACHE_UTILIZATION, MULTICLUSTER_QUEUE_SIZE}


def test_a_metric_missing_from_the_page_removes_its_attribute() -> None:
    e = extractor()
    before = e.extract(PAGE, make_endpoint(0), Metrics(), now=1.0)
    queue_only = b"llm_d_epp_average_queue_size 7\n"
    after = e.extract(queue_only, make_endpoint(0), before, now=2.0)
    assert MULTICLUSTER_KV_CACHE_UTILIZATION not in after.attributes
    assert after.attributes[MULTICLUSTER_QUEUE_SIZE] == 7.0
    with pytest.raises(ValueError, match="no pool metrics in the page of default/pod-0-rank-0"):
        e.extract(b"vllm:num_requests_waiting 3\n", make_endpoint(0), after, now=3.0)


def test_the_metrics_read_are_configurable_and_the_latest_series_wins() -> None:
    e = extractor(kvCacheUtilizationMetric='my_kv{pool="b"}', queueSizeMetric="my_queue{pool=b}")
    page = (
        b'my_kv{pool="a"} 0.9\nmy_kv{pool="b"} 0.1 2000\nmy_kv{pool="b"} 0.3 1000\n'
        b'my_queue{pool="b"} NaN\n'
    )
    metrics = e.extract(page, make_endpoint(0), Metrics(), now=1.0)
    assert metrics.attributes == {str(MULTICLUSTER_KV_CACHE_UTILIZATION): 0.1}
    with pytest.raises(ParamError, match="queueSizeMetric: invalid metric spec"):
        decode(MultiClusterMetricsExtractor.Params, {"queueSizeMetric": "a{b=~c}"})


# ---- the loader -------------------------------------------------------------------------------

UPSTREAM_EXAMPLE = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: multicluster-file-discovery
    name: discovery
    parameters:
      path: {path}
  - type: multicluster-metrics-data-source
    name: metrics-source
    parameters:
      scheme: https
{extractor}  - type: multicluster-session-affinity-filter
    name: session-affinity
  - type: multicluster-kv-cache-utilization-scorer
    name: kv-cache
  - type: multicluster-queue-scorer
    name: queue
  - type: max-score-picker
  - type: single-profile-handler
dataLayer:
  discovery:
    pluginRef: discovery
  sources:
    - pluginRef: metrics-source
{binding}"""


def load(tmp_path: Path, with_extractor: bool) -> Any:
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS)
    text = UPSTREAM_EXAMPLE.format(
        path=path,
        extractor="  - type: multicluster-metrics-extractor\n    name: metrics-extractor\n"
        if with_extractor
        else "",
        binding="      extractors:\n        - pluginRef: metrics-extractor\n"
        if with_extractor
        else "",
    )
    return load_config(
        textwrap.dedent(text),
        registry=PluginRegistry.from_entry_points(),
        handle_for=FakeHandle,
        options=LoadOptions(allow_experimental=True),
    )


def test_upstreams_example_loads_with_only_its_cluster_source(tmp_path: Path) -> None:
    pipeline = load(tmp_path, with_extractor=True)
    types = {n: p.typed_name.type for n, p in pipeline.instances.items()}
    for name, expected in {
        "discovery": "multicluster-file-discovery",
        "metrics-source": "multicluster-metrics-data-source",
        "metrics-extractor": "multicluster-metrics-extractor",
        "session-affinity": "multicluster-session-affinity-filter",
        "kv-cache": "multicluster-kv-cache-utilization-scorer",
        "queue": "multicluster-queue-scorer",
    }.items():
        assert types[name] == expected
    assert [p.source.typed_name.type for p in pipeline.sources] == [
        "multicluster-metrics-data-source"
    ]  # no pod metrics source scraping the gateways
    assert pipeline.discovery is pipeline.instances["discovery"]


def test_a_metric_scorer_without_its_extractor_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, with_extractor=False)
    assert str(info.value) == (
        "config: plugin 'kv-cache': needs the endpoint attribute "
        "'MultiClusterKVCacheUtilization/multicluster-metrics-extractor', which no extractor "
        "under dataLayer.sources publishes (configure a multicluster-metrics-extractor under a "
        "source)"
    )
