from __future__ import annotations

from typing import Any

import pytest

from epp_tools.sim.config import PodConfig, endpoint_binds, offset_endpoint_port
from epp_tools.sim.control import Faults, Overrides


@pytest.mark.parametrize(
    ("body", "match"),
    [
        pytest.param(
            {"num_requests_waiting": -1},
            "num_requests_waiting must be a non\\-negative integer",
            id="negative-count",
        ),
        pytest.param(
            {"kv_cache_usage_perc": 1.5},
            "kv_cache_usage_perc must be in \\[0\\.0, 1\\.0\\]",
            id="usage-above-one",
        ),
        pytest.param(
            {"running_lora_adapters": "a"},
            "running_lora_adapters must be a list of strings",
            id="adapters-not-a-list",
        ),
        pytest.param(
            {"max_lora": True}, "max_lora must be a non\\-negative integer", id="bool-as-int"
        ),
        pytest.param({"typo": 1}, "unknown keys: typo", id="unknown-key"),
        pytest.param([], "the body must be a JSON object", id="not-an-object"),
    ],
)
def test_overrides_parse_rejects_when_body_is_invalid(body: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Overrides.parse(body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        pytest.param(
            {"error_rate": 2}, "error_rate must be in \\[0\\.0, 1\\.0\\]", id="rate-above-one"
        ),
        pytest.param(
            {"error_status": 200},
            "error_status must be in \\[400, 599\\]",
            id="status-not-an-error",
        ),
        pytest.param({"stall_metrics": 1}, "stall_metrics must be a boolean", id="flag-not-bool"),
        pytest.param(
            {"die_mid_stream_after_chunks": -2},
            "die_mid_stream_after_chunks must be a non\\-negative integer",
            id="negative-chunks",
        ),
        pytest.param(
            {"metrics_status": 200},
            "metrics_status must be in \\[400, 599\\]",
            id="metrics-status-not-an-error",
        ),
        pytest.param(
            {"metrics_garbage": "yes"}, "metrics_garbage must be a boolean", id="garbage-not-bool"
        ),
        pytest.param({"black_hole": 1}, "black_hole must be a boolean", id="black-hole-not-bool"),
        pytest.param(
            {"metrics_delay_ms": -1}, "metrics_delay_ms must be in", id="negative-metrics-delay"
        ),
    ],
)
def test_faults_parse_rejects_when_body_is_invalid(body: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
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
    ("changes", "match"),
    [
        pytest.param({"block_size": 0}, "block_size must be >= 1, got 0", id="block-size"),
        pytest.param({"time_scale": 0.0}, "time_scale must be > 0", id="time-scale"),
        pytest.param(
            {"engine": "tgi"},
            "engine must be one of \\('vllm', 'sglang'\\), got 'tgi'",
            id="engine",
        ),
        pytest.param(
            {"model": "a", "lora_adapters": ("a",)},
            "a LoRA adapter cannot have the base model's name",
            id="lora-named-like-model",
        ),
        pytest.param({"port": 70000}, "port must be in \\[0, 65535\\], got 70000", id="port"),
    ],
)
def test_pod_config_rejects_when_value_is_out_of_range(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PodConfig(**changes)
