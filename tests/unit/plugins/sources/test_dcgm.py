from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Sequence
from typing import Any

import pytest

from epp.plugin import (
    DataSource,
    Endpoint,
    EndpointForgetter,
    Extractor,
    Lifecycle,
    Metrics,
    PollInterval,
    Stability,
)
from epp.plugin.attributes import GPU_UTILIZATION
from epp.plugin.params import ParamError, decode
from epp.plugins.sources.dcgm import DCGMDataSource, DCGMExtractor, pod_name
from tests.builders import FakeHandle, handle
from tests.conftest import ServerFactory

PAGE = b"""\
# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pod="pod-a",namespace="default"} 35
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",pod="pod-a",namespace="default"} 80
DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",pod="pod-b",namespace="default"} 99
DCGM_FI_DEV_FB_USED{gpu="0",pod="pod-a"} 1024
"""


@dataclasses.dataclass
class _Handle(FakeHandle):
    current: Sequence[Endpoint] = ()

    def endpoints(self) -> Sequence[Endpoint]:
        return self.current


def _source(h: FakeHandle | None = None, **params: Any) -> DCGMDataSource:
    decoded = decode(DCGMDataSource.Params, params)
    return DCGMDataSource(name="", params=decoded, handle=h or handle())


def _endpoint(name: str = "pod-a", *, port: int = 8000, rank: int = 0, **kw: Any) -> Endpoint:
    return Endpoint(
        id=f"default/{name}",
        name=name,
        namespace="default",
        address="127.0.0.1",
        port=port,
        rank=rank,
        **kw,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- dcgm-data-source --------------------------------------------------------------------------


def test_source_roles_and_stability() -> None:
    source = _source(interval="1s")
    assert isinstance(source, DataSource)
    assert isinstance(source, EndpointForgetter)
    assert isinstance(source, Lifecycle)
    assert isinstance(source, PollInterval)
    assert source.interval_seconds == 1.0
    assert DCGMDataSource.STABILITY is DCGMExtractor.STABILITY is Stability.ALPHA


@pytest.mark.parametrize(
    ("params", "endpoint", "expected"),
    [
        pytest.param({}, _endpoint(), "http://127.0.0.1:9400/metrics", id="default-port-9400"),
        pytest.param({"port": 0}, _endpoint(), "http://127.0.0.1:8000/metrics", id="own-port"),
        pytest.param(
            {"scheme": "https", "path": "/dcgm"},
            _endpoint(),
            "https://127.0.0.1:9400/dcgm",
            id="https-path",
        ),
        pytest.param(
            {"useNodeAddress": True},
            _endpoint(node_address="10.1.0.7"),
            "http://10.1.0.7:9400/metrics",
            id="node-address",
        ),
        pytest.param(
            {"useNodeAddress": True},
            _endpoint(),
            "http://127.0.0.1:9400/metrics",
            id="node-address-unknown-uses-pod-ip",
        ),
        pytest.param(
            {},
            dataclasses.replace(_endpoint(), address="fd00::1"),
            "http://[fd00::1]:9400/metrics",
            id="ipv6",
        ),
    ],
)
def test_url_follows_parameters(params: dict[str, Any], endpoint: Endpoint, expected: str) -> None:
    assert _source(**params).url(endpoint) == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"useNodeAddress": True, "port": 0}, "non-zero port", id="node-no-port"),
        pytest.param({"port": 70000}, "between 0 and 65535", id="port-range"),
        pytest.param({"path": "metrics"}, "must start with '/'", id="path"),
        pytest.param({"interval": "-1s"}, "must not be negative", id="interval"),
        pytest.param({"scheme": "ftp"}, "must be one of", id="scheme"),
        pytest.param({"caCertPath": "/x"}, "unknown field", id="unknown"),
    ],
)
def test_source_rejects_invalid_parameters(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(DCGMDataSource.Params, params)


async def test_poll_returns_exporter_page(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=PAGE)
    source = _source(port=server.port)
    try:
        assert await source.poll(_endpoint()) == PAGE
    finally:
        await source.stop()


async def test_poll_raises_with_url_when_nothing_listens() -> None:
    port = _free_port()
    source = _source(port=port)
    try:
        with pytest.raises(RuntimeError, match=f"GET http://127.0.0.1:{port}/metrics"):
            await source.poll(_endpoint())
    finally:
        await source.stop()


async def test_poll_raises_on_non_200(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=b"no", status=503)
    source = _source(port=server.port)
    try:
        with pytest.raises(RuntimeError, match="HTTP 503"):
            await source.poll(_endpoint())
    finally:
        await source.stop()


async def test_endpoints_sharing_an_exporter_share_one_connection(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAGE)
    source = _source(port=server.port)
    endpoints = [_endpoint(f"pod-{i}", port=8000 + i) for i in range(4)]
    try:
        for _ in range(3):
            await asyncio.gather(*(source.poll(e) for e in endpoints))
        assert len(server.peers) == 12
        assert len(set(server.peers)) == 1
    finally:
        await source.stop()


async def test_forget_keeps_connection_while_another_endpoint_uses_the_exporter(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAGE)
    a, b = _endpoint("pod-a"), _endpoint("pod-b", port=8001)
    h = _Handle(current=[b])
    source = _source(h, port=server.port)
    try:
        await source.poll(a)
        await source.poll(b)
        source.forget(a)  # b still scrapes the same exporter
        await source.poll(b)
        assert len(set(server.peers)) == 1
        h.current = []
        source.forget(b)  # the last one: the connection closes
        await source.poll(b)
        assert len(set(server.peers)) == 2
    finally:
        await source.stop()


# ---- dcgm-extractor ----------------------------------------------------------------------------


def _extract(endpoint: Endpoint, payload: bytes = PAGE, previous: Metrics | None = None) -> Metrics:
    ex = DCGMExtractor(name="", params=decode(DCGMExtractor.Params, {}), handle=handle())
    return ex.extract(payload, endpoint, previous or Metrics(), now=9.0)


def test_extractor_is_an_extractor_without_parameters() -> None:
    assert isinstance(DCGMExtractor(name="", params=None, handle=handle()), Extractor)
    with pytest.raises(ParamError, match="unknown field"):
        decode(DCGMExtractor.Params, {"metric": "x"})


def test_publishes_busiest_gpu_of_the_pod_as_fraction() -> None:
    assert _extract(_endpoint("pod-a")).attributes == {GPU_UTILIZATION: 0.8}
    assert _extract(_endpoint("pod-b")).attributes == {GPU_UTILIZATION: 0.99}


def test_kubernetes_endpoint_name_maps_to_its_pod() -> None:
    endpoint = _endpoint("pod-b-rank-1", rank=1)
    assert pod_name(endpoint) == "pod-b"
    assert _extract(endpoint).attributes == {GPU_UTILIZATION: 0.99}
    assert pod_name(_endpoint("pod-rank-1", rank=0)) == "pod-rank-1"


def test_series_without_pod_label_count_for_any_pod() -> None:
    sidecar = b'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 12\nDCGM_FI_DEV_GPU_UTIL{gpu="1"} 40\n'
    assert _extract(_endpoint("anything"), sidecar).attributes == {GPU_UTILIZATION: 0.4}


def test_missing_metric_raises() -> None:
    with pytest.raises(ValueError, match="'DCGM_FI_DEV_GPU_UTIL' not found"):
        _extract(_endpoint(), b"DCGM_FI_DEV_FB_USED 1\n")


def test_no_series_for_the_pod_raises() -> None:
    with pytest.raises(ValueError, match="no samples for pod 'pod-z'"):
        _extract(_endpoint("pod-z"))


def test_non_finite_samples_are_skipped() -> None:
    page = b'DCGM_FI_DEV_GPU_UTIL{pod="pod-a"} NaN\nDCGM_FI_DEV_GPU_UTIL{pod="pod-a"} 20\n'
    assert _extract(_endpoint(), page).attributes == {GPU_UTILIZATION: 0.2}
    with pytest.raises(ValueError, match="no samples"):
        _extract(_endpoint(), b'DCGM_FI_DEV_GPU_UTIL{pod="pod-a"} +Inf\n')


def test_keeps_other_fields_and_attributes_and_leaves_update_time() -> None:
    previous = Metrics(waiting_queue_size=5, update_time=3.0, attributes={"Topology/t": "x"})
    out = _extract(_endpoint(), previous=previous)
    assert (out.waiting_queue_size, out.update_time) == (5, 3.0)
    assert out.attributes == {"Topology/t": "x", GPU_UTILIZATION: 0.8}
