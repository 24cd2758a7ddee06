from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from epp.plugin import Endpoint, Extractor, Metrics
from epp.plugin.params import ParamError, decode
from epp.plugins.sources.core_extractor import CoreMetricsExtractor
from tests.builders import handle, make_endpoint

TESTDATA = Path(__file__).parent / "testdata"
NOW = 5000.0


def _extractor(params: dict[str, Any] | None = None) -> CoreMetricsExtractor:
    decoded = decode(CoreMetricsExtractor.Params, params or {})
    return CoreMetricsExtractor(name="", params=decoded, handle=handle())


def _endpoint(labels: dict[str, str] | None = None) -> Endpoint:
    return dataclasses.replace(make_endpoint(0, labels=labels), metrics=None)


def _golden(name: str) -> bytes:
    return (TESTDATA / f"{name}.prom").read_bytes()


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(
            "vllm",
            Metrics(
                waiting_queue_size=3,
                running_requests_size=7,
                kv_cache_usage_percent=0.4235,
                active_models=frozenset({"sql-lora", "tweet-lora"}),
                waiting_models=frozenset({"chat-lora"}),
                max_active_models=4,
                cache_block_size=16,
                cache_num_blocks=27912,
                update_time=NOW,
            ),
            id="vllm",
        ),
        pytest.param(
            "sglang",
            Metrics(
                waiting_queue_size=5,
                running_requests_size=12,
                kv_cache_usage_percent=0.61,
                cache_block_size=1,
                cache_num_blocks=131072,
                update_time=NOW,
            ),
            id="sglang",
        ),
        pytest.param(
            "trtllm-serve",
            Metrics(
                waiting_queue_size=2,
                running_requests_size=9,
                kv_cache_usage_percent=0.125,
                cache_block_size=32,
                cache_num_blocks=4096,
                update_time=NOW,
            ),
            id="trtllm-serve",
        ),
        pytest.param(
            "triton-tensorrt-llm",
            Metrics(
                waiting_queue_size=4,
                running_requests_size=6,
                kv_cache_usage_percent=0.3125,
                cache_block_size=64,
                cache_num_blocks=4000,
                update_time=NOW,
            ),
            id="triton-tensorrt-llm",
        ),
        pytest.param(
            "triton",
            Metrics(waiting_queue_size=11, running_requests_size=4871, update_time=NOW),
            id="triton",
        ),
    ],
)
def test_extract_reads_engine_metrics_when_scrape_is_golden(engine: str, expected: Metrics) -> None:
    golden = "trtllm" if engine == "trtllm-serve" else engine
    endpoint = _endpoint({"llm-d.ai/engine-type": engine})
    assert _extractor().extract(_golden(golden), endpoint, Metrics(), now=NOW) == expected


@pytest.mark.parametrize(
    ("labels", "params", "golden"),
    [
        pytest.param({}, {}, "vllm", id="no-label-default-vllm"),
        pytest.param(
            {"inference.networking.k8s.io/engine-type": "sglang"}, {}, "sglang", id="legacy-label"
        ),
        pytest.param(
            {"llm-d.ai/engine-type": "", "inference.networking.k8s.io/engine-type": "sglang"},
            {},
            "sglang",
            id="empty-label-falls-back-to-legacy",
        ),
        pytest.param({"llm-d.ai/engine-type": "unknown"}, {}, "vllm", id="unknown-uses-default"),
        pytest.param({}, {"defaultEngine": "triton"}, "triton", id="default-engine-param"),
        pytest.param(
            {"my/engine": "sglang"}, {"engineLabelKey": "my/engine"}, "sglang", id="label-key-param"
        ),
    ],
)
def test_extract_selects_engine_when_labels_and_params_vary(
    labels: dict[str, str], params: dict[str, Any], golden: str
) -> None:
    metrics = _extractor(params).extract(_golden(golden), _endpoint(labels), Metrics(), now=NOW)
    assert metrics.update_time == NOW
    assert metrics.waiting_queue_size > 0


def test_extract_raises_when_payload_has_no_expected_metric() -> None:
    with pytest.raises(ValueError, match="no vllm metrics found"):
        _extractor().extract(b"# nothing here\nother_metric 1\n", _endpoint(), Metrics(), now=NOW)


def test_extract_keeps_previous_values_when_some_metrics_are_missing() -> None:
    previous = Metrics(
        waiting_queue_size=9,
        running_requests_size=8,
        kv_cache_usage_percent=0.5,
        active_models=frozenset({"a"}),
        max_active_models=2,
        cache_block_size=16,
        update_time=1.0,
    )
    payload = b"vllm:num_requests_waiting 1\n"
    metrics = _extractor().extract(payload, _endpoint(), previous, now=NOW)
    assert metrics == dataclasses.replace(previous, waiting_queue_size=1, update_time=NOW)


@pytest.mark.parametrize(
    ("payload", "expected_queue"),
    [
        pytest.param(
            b'vllm:num_requests_waiting{e="0"} 4 2000\nvllm:num_requests_waiting{e="1"} 6 1000\n',
            4,
            id="greatest-timestamp",
        ),
        pytest.param(
            b'vllm:num_requests_waiting{e="0"} 4\nvllm:num_requests_waiting{e="1"} 6\n',
            6,
            id="no-timestamps-last",
        ),
        pytest.param(
            b"vllm:num_requests_waiting 4 1000\nvllm:num_requests_waiting 6 1000\n",
            6,
            id="equal-timestamps-last",
        ),
    ],
)
def test_extract_picks_latest_series_when_several_match(
    payload: bytes, expected_queue: int
) -> None:
    metrics = _extractor().extract(payload, _endpoint(), Metrics(), now=NOW)
    assert metrics.waiting_queue_size == expected_queue


def test_extract_ignores_value_when_it_is_not_finite() -> None:
    previous = Metrics(kv_cache_usage_percent=0.25)
    payload = b"vllm:kv_cache_usage_perc NaN\nvllm:num_requests_running 2\n"
    metrics = _extractor().extract(payload, _endpoint(), previous, now=NOW)
    assert (metrics.kv_cache_usage_percent, metrics.running_requests_size) == (0.25, 2)


def test_extract_keeps_lora_state_when_lora_family_is_missing() -> None:
    previous = Metrics(active_models=frozenset({"a"}), max_active_models=3)
    metrics = _extractor().extract(b"vllm:num_requests_waiting 0\n", _endpoint(), previous, now=NOW)
    assert (metrics.active_models, metrics.max_active_models) == (frozenset({"a"}), 3)


@pytest.mark.parametrize(
    ("labels", "expected_active", "expected_waiting", "expected_max"),
    [
        pytest.param(
            'running_lora_adapters=" a ,b,, ",waiting_lora_adapters="",max_lora="2"',
            {"a", "b"},
            set(),
            2,
            id="trimmed",
        ),
        pytest.param(
            'running_lora_adapters="",waiting_lora_adapters="c"',
            set(),
            {"c"},
            7,
            id="no-max-keeps-previous",
        ),
        pytest.param(
            'running_lora_adapters="a",max_lora="x"', {"a"}, set(), 7, id="bad-max-keeps-previous"
        ),
    ],
)
def test_extract_reads_lora_labels_when_series_present(
    labels: str, expected_active: set[str], expected_waiting: set[str], expected_max: int
) -> None:
    payload = f"vllm:lora_requests_info{{{labels}}} 1.7e9\n".encode()
    previous = Metrics(active_models=frozenset({"old"}), max_active_models=7)
    metrics = _extractor().extract(payload, _endpoint(), previous, now=NOW)
    assert metrics.active_models == frozenset(expected_active)
    assert metrics.waiting_models == frozenset(expected_waiting)
    assert metrics.max_active_models == expected_max


def test_extract_returns_previous_when_engine_only_has_missing_lora() -> None:
    params = {"engineConfigs": [{"name": "lora-only", "loraSpec": "vllm:lora_requests_info"}]}
    previous = Metrics(waiting_queue_size=1)
    endpoint = _endpoint({"llm-d.ai/engine-type": "lora-only"})
    assert _extractor(params).extract(b"x 1\n", endpoint, previous, now=NOW) is previous


def test_extract_uses_user_engine_when_it_overrides_builtin() -> None:
    params = {
        "engineConfigs": [
            {
                "name": "vllm",
                "queuedRequestsSpec": "vllm:num_requests_waiting_by_reason{reason=capacity}",
                "runningRequestsSpec": "vllm:num_requests_running",
            }
        ]
    }
    metrics = _extractor(params).extract(_golden("vllm"), _endpoint(), Metrics(), now=NOW)
    assert metrics == Metrics(waiting_queue_size=99, running_requests_size=7, update_time=NOW)


def test_extract_stores_custom_metrics_when_engine_declares_them() -> None:
    params = {
        "engineConfigs": [
            {
                "name": "vllm",
                "queuedRequestsSpec": "vllm:num_requests_waiting",
                "customMetrics": [
                    {"attributeKey": "prompt-tokens", "metricSpec": "vllm:prompt_tokens_total"},
                    {
                        "attributeKey": "ttft-count",
                        "metricSpec": "vllm:time_to_first_token_seconds_count",
                    },
                    {"attributeKey": "absent", "metricSpec": "not_there"},
                ],
            }
        ]
    }
    previous = Metrics(custom={"absent": 1.5, "prompt-tokens": 1.0})
    metrics = _extractor(params).extract(_golden("vllm"), _endpoint(), previous, now=NOW)
    assert metrics.custom == {"absent": 1.5, "prompt-tokens": 182934.0, "ttft-count": 412.0}
    assert previous.custom == {"absent": 1.5, "prompt-tokens": 1.0}


@pytest.mark.parametrize(
    ("params", "path", "problem"),
    [
        pytest.param(
            {"engineConfigs": [{"name": "default"}]}, "engineConfigs[0]", "reserved", id="reserved"
        ),
        pytest.param({"defaultEngine": "nope"}, "", "not found", id="unknown-default"),
        pytest.param({"engineLabelKey": ""}, "", "cannot be empty", id="empty-label-key"),
        pytest.param({"engines": []}, "engines", "unknown field", id="unknown-field"),
    ],
)
def test_params_decode_fails_when_parameters_are_invalid(
    params: dict[str, Any], path: str, problem: str
) -> None:
    with pytest.raises(ParamError) as info:
        decode(CoreMetricsExtractor.Params, params)
    assert info.value.path == path
    assert problem in info.value.problem


def test_extractor_fills_extractor_role_when_checked_at_runtime() -> None:
    extractor = _extractor()
    assert isinstance(extractor, Extractor)
    assert str(extractor.typed_name) == "core-metrics-extractor/core-metrics-extractor"
