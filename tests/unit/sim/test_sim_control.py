from __future__ import annotations

from typing import Any

import pytest

from epp.sim.config import PodConfig, endpoint_binds, offset_endpoint_port
from epp.sim.control import Faults, Overrides


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"num_requests_waiting": -1}, id="negative-count"),
        pytest.param({"kv_cache_usage_perc": 1.5}, id="usage-above-one"),
        pytest.param({"running_lora_adapters": "a"}, id="adapters-not-a-list"),
        pytest.param({"max_lora": True}, id="bool-as-int"),
        pytest.param({"typo": 1}, id="unknown-key"),
        pytest.param([], id="not-an-object"),
    ],
)
def test_overrides_parse_rejects_when_body_is_invalid(body: Any) -> None:
    with pytest.raises(ValueError):
        Overrides.parse(body)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"error_rate": 2}, id="rate-above-one"),
        pytest.param({"error_status": 200}, id="status-not-an-error"),
        pytest.param({"stall_metrics": 1}, id="flag-not-bool"),
        pytest.param({"die_mid_stream_after_chunks": -2}, id="negative-chunks"),
        pytest.param({"metrics_status": 200}, id="metrics-status-not-an-error"),
        pytest.param({"metrics_garbage": "yes"}, id="garbage-not-bool"),
        pytest.param({"black_hole": 1}, id="black-hole-not-bool"),
        pytest.param({"metrics_delay_ms": -1}, id="negative-metrics-delay"),
    ],
)
def test_faults_parse_rejects_when_body_is_invalid(body: Any) -> None:
    with pytest.raises(ValueError):
        Faults.parse(body)


def test_empty_body_clears_when_parsed() -> None:
    assert Overrides.parse({}) == Overrides()
    assert Faults.parse({}) == Faults()
    assert Overrides.parse({"waiting_lora_adapters": []}).as_json() == {"waiting_lora_adapters": []}


@pytest.mark.parametrize(
    ("endpoint", "binds"),
    [
        pytest.param("tcp://*:5557", True, id="wildcard-host"),
        pytest.param("tcp://[::]:5557", True, id="ipv6-any"),
        pytest.param("ipc:///tmp/kv", True, id="ipc"),
        pytest.param("inproc://kv", True, id="inproc"),
        pytest.param("tcp://127.0.0.1:5557", False, id="concrete-host"),
    ],
)
def test_endpoint_binds_follows_vllm_rule_when_given_endpoint(endpoint: str, binds: bool) -> None:
    assert endpoint_binds(endpoint) is binds


@pytest.mark.parametrize(
    ("endpoint", "offset", "expected"),
    [
        pytest.param("tcp://*:5557", 3, "tcp://*:5560", id="tcp"),
        pytest.param("tcp://127.0.0.1:*", 3, "tcp://127.0.0.1:*", id="wildcard-port"),
        pytest.param("ipc:///tmp/kv", 3, "ipc:///tmp/kv", id="ipc"),
    ],
)
def test_offset_endpoint_port_adds_pod_index_when_port_is_numeric(
    endpoint: str, offset: int, expected: str
) -> None:
    assert offset_endpoint_port(endpoint, offset) == expected


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"block_size": 0}, id="block-size"),
        pytest.param({"time_scale": 0.0}, id="time-scale"),
        pytest.param({"engine": "tgi"}, id="engine"),
        pytest.param({"model": "a", "lora_adapters": ("a",)}, id="lora-named-like-model"),
        pytest.param({"port": 70000}, id="port"),
    ],
)
def test_pod_config_rejects_when_value_is_out_of_range(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        PodConfig(**changes)
