"""``models-data-source`` and ``models-data-extractor``: each endpoint's ``/v1/models`` as the
``ModelDataCollection/models-data-extractor`` attribute, polled from a simulated vLLM pod."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from epp.plugin import (
    DataSource,
    Endpoint,
    EndpointForgetter,
    Extractor,
    Lifecycle,
    Metrics,
    PollInterval,
    ReachabilityProbe,
    Stability,
    endpoint_attribute,
)
from epp.plugin.attributes import SERVED_MODELS, ModelData
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_data_source, check_extractor
from epp.plugins.sources.models import ModelsDataExtractor, ModelsDataSource, parse_models
from tests.builders import handle
from tests.conftest import dead_ports


def _source(**params: Any) -> ModelsDataSource:
    return ModelsDataSource(
        name="", params=decode(ModelsDataSource.Params, params), handle=handle()
    )


def _endpoint(port: int) -> Endpoint:
    return Endpoint(
        id="default/pod-0", name="pod-0", namespace="default", address="127.0.0.1", port=port
    )


EXTRACTOR = ModelsDataExtractor(name="", params=None, handle=handle())


def test_roles_and_upstream_parameters() -> None:
    source = _source()
    assert isinstance(source, DataSource) and isinstance(source, Lifecycle)
    assert isinstance(source, EndpointForgetter) and isinstance(source, PollInterval)
    assert isinstance(source, ReachabilityProbe) and not source.reaches_endpoint
    assert isinstance(EXTRACTOR, Extractor)
    assert ModelsDataSource.STABILITY is Stability.BETA
    assert source.url(_endpoint(8000)) == "http://127.0.0.1:8000/v1/models"
    tls = _source(scheme="https", path="/models", interval="5s")
    assert tls.url(_endpoint(8443)) == "https://127.0.0.1:8443/models"
    assert tls.interval_seconds == 5.0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"port": 9000}, "unknown field"),  # upstream's models source has no port
        ({"scheme": "ftp"}, "scheme"),
        ({"path": "v1/models"}, "must start with '/'"),
        ({"clientCertPath": "/c.pem"}, "set together"),
    ],
)
def test_invalid_parameters_are_refused(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ParamError, match=message):
        decode(ModelsDataSource.Params, params)


async def test_the_models_of_a_simulated_vllm_pod(sim_pods: Any) -> None:
    fleet = await sim_pods(1, model="base-model", lora_adapters=("sql-lora", "chat-lora"))
    source = _source()
    try:
        payload = await source.poll(_endpoint(fleet.ports[0]))
    finally:
        await source.stop()
    metrics = EXTRACTOR.extract(payload, _endpoint(fleet.ports[0]), Metrics(), now=1.0)
    models = metrics.attributes[SERVED_MODELS]
    assert [(m.id, m.parent, m.owned_by, m.object) for m in models] == [
        ("base-model", "", "vllm", "model"),
        ("sql-lora", "base-model", "vllm", "model"),
        ("chat-lora", "base-model", "vllm", "model"),
    ]
    assert all(m.created > 0 for m in models)
    ep = Endpoint(id="e", name="e", namespace="d", address="127.0.0.1", port=1, metrics=metrics)
    assert endpoint_attribute(ep, SERVED_MODELS) == models


async def test_a_pod_that_is_not_there_fails_the_poll() -> None:
    (port,) = dead_ports(1)  # refuses connections
    source = _source()
    try:
        await check_data_source(source, _endpoint(port))
    finally:
        await source.stop()


def test_entries_are_read_leniently_and_unchanged_lists_keep_the_object() -> None:
    body = orjson.dumps(
        {
            "object": "list",
            "data": [
                {"id": "m", "created": "yesterday", "parent": None, "root": "m"},
                {"object": "model"},  # no id: skipped
                "not an entry",
                {"id": "a", "parent": "m", "owned_by": "sglang", "created": 7},
            ],
        }
    )
    assert parse_models(body) == (
        ModelData(id="m"),
        ModelData(id="a", parent="m", owned_by="sglang", created=7),
    )
    first = check_extractor(EXTRACTOR, body, _endpoint(1))
    assert EXTRACTOR.extract(body, _endpoint(1), first, now=2.0) is first


@pytest.mark.parametrize("body", [b"<html>", b"[1, 2]", b'{"object": "list"}', b'{"data": {}}'])
def test_an_answer_that_is_no_model_list_is_an_extract_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        parse_models(body)
