from __future__ import annotations

import pytest

from epp.plugin.params import ParamError, decode
from epp.plugins.sources.engines import (
    BUILTIN_ENGINES,
    CustomMetric,
    EngineConfig,
    EngineMapping,
    MetricSpec,
    build_registry,
    parse_spec,
)
from epp.plugins.sources.promtext import Sample


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "vllm:num_requests_waiting", MetricSpec("vllm:num_requests_waiting"), id="name"
        ),
        pytest.param("m{}", MetricSpec("m"), id="empty-braces"),
        pytest.param("m{a=b}", MetricSpec("m", {"a": "b"}), id="unquoted"),
        pytest.param('m{a="b"}', MetricSpec("m", {"a": "b"}), id="quoted"),
        pytest.param("m{a=b,c=d}", MetricSpec("m", {"a": "b", "c": "d"}), id="two-labels"),
        pytest.param(' m { a = b , c="d" } ', MetricSpec("m", {"a": "b", "c": "d"}), id="spaces"),
        pytest.param('m{a="x,y}"}', MetricSpec("m", {"a": "x,y}"}), id="quoted-punctuation"),
        pytest.param('m{a="q\\"t"}', MetricSpec("m", {"a": 'q"t'}), id="quoted-escape"),
        pytest.param("m{a=b,}", MetricSpec("m", {"a": "b"}), id="trailing-comma"),
    ],
)
def test_parse_spec_reads_name_and_labels_when_spec_is_valid(
    text: str, expected: MetricSpec
) -> None:
    assert parse_spec(text) == expected


@pytest.mark.parametrize("text", [pytest.param("", id="empty"), pytest.param("  ", id="blank")])
def test_parse_spec_returns_none_when_spec_is_empty(text: str) -> None:
    assert parse_spec(text) is None


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{a=b}", id="no-name"),
        pytest.param("m{a!=b}", id="not-equal-matcher"),
        pytest.param("m{a=~b.*}", id="regex-matcher"),
        pytest.param("m{a=b", id="unclosed"),
        pytest.param("m{a=b c=d}", id="missing-comma"),
        pytest.param("m{a=b,a=c}", id="duplicate-label"),
        pytest.param("1m", id="bad-name"),
        pytest.param("m x", id="trailing-garbage"),
    ],
)
def test_parse_spec_raises_when_spec_is_invalid(text: str) -> None:
    with pytest.raises(ValueError, match="invalid metric spec"):
        parse_spec(text)


@pytest.mark.parametrize(
    ("spec", "labels", "expected"),
    [
        pytest.param("m", {"x": "1"}, True, id="no-selector"),
        pytest.param("m{x=1}", {"x": "1", "y": "2"}, True, id="subset"),
        pytest.param("m{x=1}", {"x": "2"}, False, id="other-value"),
        pytest.param("m{x=1}", {}, False, id="label-missing"),
    ],
)
def test_spec_matches_sample_when_labels_agree(
    spec: str, labels: dict[str, str], expected: bool
) -> None:
    parsed = parse_spec(spec)
    assert parsed is not None
    assert parsed.matches(Sample("m", labels, 1.0)) is expected


@pytest.mark.parametrize(
    ("engine", "field", "spec"),
    [
        pytest.param("vllm", "queued", "vllm:num_requests_waiting", id="vllm-queue"),
        pytest.param("vllm", "running", "vllm:num_requests_running", id="vllm-running"),
        pytest.param("vllm", "kv_usage", "vllm:kv_cache_usage_perc", id="vllm-kv"),
        pytest.param("vllm", "lora", "vllm:lora_requests_info", id="vllm-lora"),
        pytest.param("vllm", "cache_info", "vllm:cache_config_info", id="vllm-cache"),
        pytest.param("sglang", "queued", "sglang:num_queue_reqs", id="sglang-queue"),
        pytest.param("sglang", "running", "sglang:num_running_reqs", id="sglang-running"),
        pytest.param("sglang", "kv_usage", "sglang:token_usage", id="sglang-kv"),
        pytest.param("sglang", "cache_info", "sglang:cache_config_info", id="sglang-cache"),
        pytest.param("trtllm-serve", "queued", "trtllm_num_requests_waiting", id="trt-queue"),
        pytest.param("trtllm-serve", "running", "trtllm_num_requests_running", id="trt-running"),
        pytest.param("trtllm-serve", "kv_usage", "trtllm_kv_cache_utilization", id="trt-kv"),
        pytest.param(
            "trtllm-serve", "cache_block_size", "trtllm_kv_cache_tokens_per_block", id="trt-bs"
        ),
        pytest.param("trtllm-serve", "cache_num_blocks", "trtllm_kv_cache_max_blocks", id="trt-nb"),
        pytest.param(
            "triton-tensorrt-llm",
            "queued",
            'nv_trt_llm_request_metrics{request_type="waiting"}',
            id="triton-trt-queue",
        ),
        pytest.param(
            "triton-tensorrt-llm",
            "running",
            'nv_trt_llm_request_metrics{request_type="scheduled"}',
            id="triton-trt-running",
        ),
        pytest.param(
            "triton-tensorrt-llm",
            "kv_usage",
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
            id="triton-trt-kv",
        ),
        pytest.param(
            "triton-tensorrt-llm",
            "cache_block_size",
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per"}',
            id="triton-trt-bs",
        ),
        pytest.param(
            "triton-tensorrt-llm",
            "cache_num_blocks",
            'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max"}',
            id="triton-trt-nb",
        ),
        pytest.param("triton", "queued", "nv_inference_pending_request_count", id="triton-queue"),
        pytest.param("triton", "running", "nv_inference_exec_count", id="triton-running"),
        pytest.param("triton", "kv_usage", None, id="triton-no-kv"),
        pytest.param("sglang", "lora", None, id="sglang-no-lora"),
    ],
)
def test_builtin_engine_uses_upstream_metric_when_engine_is_builtin(
    engine: str, field: str, spec: str | None
) -> None:
    registry, _ = build_registry((), "vllm")
    selected = getattr(registry[engine], field)
    assert (None if selected is None else str(selected)) == spec


@pytest.mark.parametrize(
    ("engine", "labels"),
    [
        pytest.param("vllm", ("block_size", "num_gpu_blocks"), id="vllm"),
        pytest.param("sglang", ("page_size", "num_pages"), id="sglang"),
    ],
)
def test_cache_info_label_names_follow_engine_when_engine_is_builtin(
    engine: str, labels: tuple[str, str]
) -> None:
    registry, _ = build_registry((), "vllm")
    mapping = registry[engine]
    assert (mapping.cache_block_size_label, mapping.cache_num_blocks_label) == labels


def test_builtin_engines_are_the_five_upstream_engines_when_listed() -> None:
    assert [e.name for e in BUILTIN_ENGINES] == [
        "vllm",
        "sglang",
        "trtllm-serve",
        "triton-tensorrt-llm",
        "triton",
    ]


def test_mapping_wanted_lists_every_series_name_when_built() -> None:
    config = EngineConfig(
        name="e",
        queued_requests_spec="q{a=b}",
        kv_usage_spec="kv",
        custom_metrics=(CustomMetric(attribute_key="t", metric_spec="temp{gpu=0}"),),
    )
    assert EngineMapping.build(config).wanted == frozenset({"q", "kv", "temp"})


def test_build_registry_replaces_builtin_when_user_config_has_same_name() -> None:
    mine = EngineConfig(name="vllm", queued_requests_spec="my_queue")
    registry, default = build_registry((mine,), "vllm")
    assert str(registry["vllm"].queued) == "my_queue"
    assert registry["vllm"].kv_usage is None
    assert default is registry["vllm"]
    assert str(registry["sglang"].queued) == "sglang:num_queue_reqs"


@pytest.mark.parametrize(
    ("configs", "default", "message"),
    [
        pytest.param((), "nope", "defaultEngine 'nope' not found", id="unknown-default"),
        pytest.param(
            (EngineConfig(name="x"), EngineConfig(name="x")), "vllm", "defined twice", id="dup"
        ),
    ],
)
def test_build_registry_raises_when_configs_are_inconsistent(
    configs: tuple[EngineConfig, ...], default: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_registry(configs, default)


@pytest.mark.parametrize(
    ("data", "path", "problem"),
    [
        pytest.param({"name": "default"}, "", "reserved", id="reserved-name"),
        pytest.param({}, "", "name cannot be empty", id="no-name"),
        pytest.param(
            {"name": "e", "kvUsageSpec": "kv{a!=b}"}, "", "invalid metric spec", id="spec"
        ),
        pytest.param(
            {"name": "e", "customMetrics": [{"metricSpec": "m"}]},
            "customMetrics[0]",
            "attributeKey cannot be empty",
            id="custom-no-key",
        ),
        pytest.param(
            {"name": "e", "customMetrics": [{"attributeKey": "k"}]},
            "customMetrics[0]",
            "metricSpec cannot be empty",
            id="custom-no-spec",
        ),
        pytest.param(
            {
                "name": "e",
                "customMetrics": [
                    {"attributeKey": "k", "metricSpec": "a"},
                    {"attributeKey": "k", "metricSpec": "b"},
                ],
            },
            "",
            "duplicated",
            id="custom-duplicate-key",
        ),
        pytest.param({"name": "e", "queueSpec": "q"}, "queueSpec", "unknown field", id="unknown"),
    ],
)
def test_engine_config_decode_fails_when_yaml_is_invalid(
    data: dict[str, object], path: str, problem: str
) -> None:
    with pytest.raises(ParamError) as info:
        decode(EngineConfig, data)
    assert info.value.path == path
    assert problem in info.value.problem


def test_engine_config_decodes_every_upstream_key_when_yaml_is_complete() -> None:
    config = decode(
        EngineConfig,
        {
            "name": "custom",
            "queuedRequestsSpec": "q",
            "runningRequestsSpec": "r",
            "kvUsageSpec": "kv",
            "loraSpec": "lora",
            "cacheInfoSpec": "info",
            "cacheBlockSizeLabelName": "bs",
            "cacheNumBlocksLabelName": "nb",
            "cacheBlockSizeSpec": "bsg",
            "cacheNumBlocksSpec": "nbg",
            "customMetrics": [{"attributeKey": "k", "metricSpec": "m{x=1}"}],
        },
    )
    mapping = EngineMapping.build(config)
    assert mapping.wanted == frozenset({"q", "r", "kv", "lora", "info", "bsg", "nbg", "m"})
    assert (mapping.cache_block_size_label, mapping.cache_num_blocks_label) == ("bs", "nb")
    assert mapping.custom == (("k", MetricSpec("m", {"x": "1"})),)
