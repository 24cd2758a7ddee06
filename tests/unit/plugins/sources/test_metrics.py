from __future__ import annotations

from typing import Any

import pytest

from epp.plugin import DataSource, Endpoint, EndpointForgetter, Lifecycle, PluginConfigError
from epp.plugin.params import ParamError, decode
from epp.plugins.sources.metrics import MetricsDataSource
from tests.builders import handle
from tests.conftest import ServerFactory

PAYLOAD = b"vllm:num_requests_waiting 3\n"


def _source(**params: Any) -> MetricsDataSource:
    decoded = decode(MetricsDataSource.Params, params)
    return MetricsDataSource(name="", params=decoded, handle=handle())


async def test_poll_returns_body_when_server_answers_200(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=PAYLOAD)
    source = _source()
    try:
        assert await source.poll(server.endpoint("a")) == PAYLOAD
    finally:
        await source.stop()


async def test_poll_raises_when_server_answers_500(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=b"boom", status=500)
    source = _source()
    try:
        with pytest.raises(RuntimeError, match="HTTP 500"):
            await source.poll(server.endpoint("a"))
    finally:
        await source.stop()


async def test_poll_uses_override_port_when_port_param_set(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=PAYLOAD)
    source = _source(port=server.port)
    endpoint = Endpoint(id="default/a", name="a", namespace="default", address="127.0.0.1", port=1)
    try:
        assert await source.poll(endpoint) == PAYLOAD
    finally:
        await source.stop()


async def test_poll_reuses_one_connection_when_polling_repeatedly(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAYLOAD)
    source = _source()
    await source.start()
    try:
        for _ in range(5):
            await source.poll(server.endpoint("a"))
        assert len(server.peers) == 5
        assert len(set(server.peers)) == 1
    finally:
        await source.stop()


async def test_poll_opens_new_session_when_polled_after_stop(metrics_server: ServerFactory) -> None:
    server = await metrics_server(payload=PAYLOAD)
    source = _source()
    await source.poll(server.endpoint("a"))
    await source.stop()
    try:
        assert await source.poll(server.endpoint("a")) == PAYLOAD
    finally:
        await source.stop()


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        pytest.param({}, "http://10.0.0.1:8000/metrics", id="defaults"),
        pytest.param({"scheme": "https", "path": "/m"}, "https://10.0.0.1:8000/m", id="https"),
        pytest.param({"port": 9090}, "http://10.0.0.1:9090/metrics", id="port-override"),
    ],
)
def test_url_is_built_from_params_when_endpoint_is_ipv4(
    params: dict[str, Any], expected: str
) -> None:
    endpoint = Endpoint(id="d/a", name="a", namespace="d", address="10.0.0.1", port=8000)
    assert _source(**params).url(endpoint) == expected


def test_url_brackets_address_when_endpoint_is_ipv6() -> None:
    endpoint = Endpoint(id="d/a", name="a", namespace="d", address="fd00::1", port=8000)
    assert _source().url(endpoint) == "http://[fd00::1]:8000/metrics"


@pytest.mark.parametrize(
    ("interval", "seconds"),
    [
        pytest.param("", 0.0, id="every-tick"),
        pytest.param("200ms", 0.2, id="ms"),
        pytest.param("1m30s", 90.0, id="compound"),
    ],
)
def test_interval_seconds_parses_go_duration_when_interval_set(
    interval: str, seconds: float
) -> None:
    assert _source(interval=interval).interval_seconds == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("params", "path", "problem"),
    [
        pytest.param({"scheme": "ftp"}, "scheme", "must be one of", id="scheme"),
        pytest.param({"port": 70000}, "", "port must be between", id="port"),
        pytest.param({"path": "metrics"}, "", "must start with '/'", id="path"),
        pytest.param({"interval": "often"}, "", "invalid duration", id="interval"),
        pytest.param({"clientCertPath": "/c.pem"}, "", "set together", id="cert-without-key"),
        pytest.param({"insecureSkipVerify": "yes"}, "insecureSkipVerify", "boolean", id="bool"),
    ],
)
def test_params_decode_fails_when_parameters_are_invalid(
    params: dict[str, Any], path: str, problem: str
) -> None:
    with pytest.raises(ParamError) as info:
        decode(MetricsDataSource.Params, params)
    assert info.value.path == path
    assert problem in info.value.problem


def test_constructor_fails_when_ca_file_is_missing() -> None:
    with pytest.raises(PluginConfigError, match="metrics-data-source"):
        _source(scheme="https", insecureSkipVerify=False, caCertPath="/nonexistent/ca.pem")


def test_source_fills_data_source_and_lifecycle_roles_when_checked_at_runtime() -> None:
    source = _source()
    assert isinstance(source, DataSource)
    assert isinstance(source, Lifecycle)


async def test_forget_closes_the_kept_alive_connection_when_endpoint_leaves(
    metrics_server: ServerFactory,
) -> None:
    server = await metrics_server(payload=PAYLOAD)
    source = _source()
    endpoint = server.endpoint("a")
    await source.start()
    try:
        await source.poll(endpoint)
        await source.poll(endpoint)
        assert isinstance(source, EndpointForgetter)
        source.forget(endpoint)
        await source.poll(endpoint)
        assert len(set(server.peers)) == 2  # the third scrape needed a new connection
    finally:
        await source.stop()
