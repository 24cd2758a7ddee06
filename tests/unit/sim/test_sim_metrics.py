from __future__ import annotations

import re

import pytest

from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Overrides
from epp_tools.sim.engine import Engine
from epp_tools.sim.metrics import MetricsRenderer, parse_text

TYPE_LINE = re.compile(r"^# TYPE (\S+) (gauge|counter|histogram)$", re.M)


def render(config: PodConfig, overrides: Overrides | None = None, now: float = 100.0) -> str:
    engine = Engine(config)
    engine.add_request("r", list(range(1, 40)), 4, 0.0)
    engine.advance(0.0)
    return MetricsRenderer(config).render(engine, overrides or Overrides(), now)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        pytest.param(
            "vllm",
            {
                "vllm:num_requests_running": "gauge",
                "vllm:num_requests_waiting": "gauge",
                "vllm:kv_cache_usage_perc": "gauge",
                "vllm:prefix_cache_queries_total": "counter",
                "vllm:prefix_cache_hits_total": "counter",
                "vllm:cache_config_info": "gauge",
                "vllm:lora_requests_info": "gauge",
                "vllm:prompt_tokens_total": "counter",
                "vllm:generation_tokens_total": "counter",
                "vllm:request_success_total": "counter",
                "vllm:time_to_first_token_seconds": "histogram",
                "vllm:inter_token_latency_seconds": "histogram",
                "vllm:e2e_request_latency_seconds": "histogram",
            },
            id="vllm",
        ),
        pytest.param(
            "sglang",
            {
                "sglang:num_running_reqs": "gauge",
                "sglang:num_queue_reqs": "gauge",
                "sglang:token_usage": "gauge",
                "sglang:cache_config_info": "gauge",
            },
            id="sglang",
        ),
    ],
)
def test_render_declares_engine_families_when_engine_is_selected(
    engine: str, expected: dict[str, str]
) -> None:
    text = render(PodConfig(engine=engine, lora_adapters=("a",)))  # type: ignore[arg-type]
    types = dict(TYPE_LINE.findall(text))
    assert {name: types.get(name) for name in expected} == expected


def test_render_labels_series_with_engine_and_model_when_vllm() -> None:
    config = PodConfig(model="m1", block_size=16, num_gpu_blocks=100)
    samples = list(parse_text(render(config)))
    by_name = {name: (labels, value) for name, labels, value in samples}
    assert by_name["vllm:num_requests_running"] == ({"engine": "0", "model_name": "m1"}, 1.0)
    assert by_name["vllm:kv_cache_usage_perc"][1] == pytest.approx(3 / 100)
    info_labels, info_value = by_name["vllm:cache_config_info"]
    assert info_value == 1.0
    assert info_labels["block_size"] == "16"
    assert info_labels["num_gpu_blocks"] == "100"
    assert info_labels["enable_prefix_caching"] == "True"
    assert info_labels["prefix_caching_hash_algo"] == "sha256"
    assert "vllm:lora_requests_info" not in by_name  # LoRA disabled


def test_overrides_replace_live_values_when_pinned() -> None:
    overrides = Overrides.parse(
        {
            "num_requests_waiting": 3,
            "kv_cache_usage_perc": 0.2,
            "running_lora_adapters": ["a", "b"],
            "max_lora": 4,
        }
    )
    text = render(PodConfig(lora_adapters=("a", "b")), overrides, now=1234.5)
    samples = {name: (labels, value) for name, labels, value in parse_text(text)}
    assert samples["vllm:num_requests_waiting"][1] == 3.0
    assert samples["vllm:num_requests_running"][1] == 1.0  # not pinned: live value
    assert samples["vllm:kv_cache_usage_perc"][1] == 0.2
    lora_labels, stamp = samples["vllm:lora_requests_info"]
    assert lora_labels == {
        "max_lora": "4",
        "running_lora_adapters": "a,b",
        "waiting_lora_adapters": "",
    }
    assert stamp == 1234.5


def test_lora_info_keeps_older_label_sets_when_state_changes() -> None:
    config = PodConfig(lora_adapters=("a",))
    engine = Engine(config)
    renderer = MetricsRenderer(config)
    renderer.render(engine, Overrides(), 10.0)
    engine.add_request("r", [1, 2, 3], 5, 0.0, lora="a")
    engine.advance(0.0)
    text = renderer.render(engine, Overrides(), 20.0)
    series = [(lab["running_lora_adapters"], v) for n, lab, v in parse_text(text) if "lora" in n]
    assert series == [("", 10.0), ("a", 20.0)]


def test_histogram_buckets_are_cumulative_when_observations_exist() -> None:
    config = PodConfig(decode_base_ms=20.0, decode_per_seq_ms=0.0)
    engine = Engine(config)
    engine.add_request("r", [1, 2, 3, 4], 3, 0.0)
    engine.advance(0.0)
    for _ in range(10):
        wake = engine.next_wakeup()
        if wake is None:
            break
        engine.advance(wake)
    text = MetricsRenderer(config).render(engine, Overrides(), 0.0)
    buckets = [
        (labels["le"], value)
        for name, labels, value in parse_text(text)
        if name == "vllm:inter_token_latency_seconds_bucket"
    ]
    assert dict(buckets)["0.01"] == 0.0
    assert dict(buckets)["0.025"] == 2.0
    assert buckets[-1] == ("+Inf", 2.0)
    values = [v for _, v in buckets]
    assert values == sorted(values)


@pytest.mark.parametrize(
    ("family", "companion"),
    [
        pytest.param("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits_created", id="total"),
        pytest.param("vllm:request_success_total", "vllm:request_success_created", id="labelled"),
        pytest.param(
            "vllm:e2e_request_latency_seconds",
            "vllm:e2e_request_latency_seconds_created",
            id="histogram",
        ),
    ],
)
def test_created_gauge_follows_family_when_vllm(family: str, companion: str) -> None:
    text = render(PodConfig(), now=50.0)
    types = dict(TYPE_LINE.findall(text))
    assert types[companion] == "gauge"
    names = list(types)
    assert names.index(companion) == names.index(family) + 1
    created = [(lab, v) for n, lab, v in parse_text(text) if n == companion]
    assert {v for _, v in created} == {50.0}  # the first render's wall time
    assert "finished_reason" not in created[0][0] or len(created) == 5


def test_created_gauges_are_absent_when_sglang() -> None:
    text = render(PodConfig(engine="sglang"))
    assert "_created" not in text


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        pytest.param("stop", 0.0, id="stop"),
        pytest.param("length", 1.0, id="length"),
        pytest.param("abort", 0.0, id="abort-never-counted"),
        pytest.param("error", 0.0, id="error"),
        pytest.param("repetition", 0.0, id="repetition"),
    ],
)
def test_request_success_lists_every_vllm_reason_when_rendered(
    reason: str, expected: float
) -> None:
    config = PodConfig(decode_base_ms=1.0)
    engine = Engine(config)
    engine.add_request("done", [1, 2, 3], 1, 0.0)
    engine.add_request("gone", [4, 5, 6], 50, 0.0)
    engine.abort_request("gone")
    engine.advance(0.0)
    for _ in range(20):  # bounded: a 1-token request finishes in a couple of steps
        wake = engine.next_wakeup()
        if wake is None:
            break
        engine.advance(wake)
    text = MetricsRenderer(config).render(engine, Overrides(), 0.0)
    values = {
        lab["finished_reason"]: v
        for n, lab, v in parse_text(text)
        if n == "vllm:request_success_total"
    }
    assert values[reason] == expected


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        pytest.param("block_size", "32", id="block-size"),
        pytest.param("effective_attention_block_size", "32", id="effective-block-size"),
        pytest.param("num_gpu_blocks", "1000", id="blocks"),
        pytest.param("kv_cache_size_tokens", "32000", id="tokens"),
        pytest.param("kv_cache_memory_bytes", str(32000 * 131072), id="bytes"),
        pytest.param("kv_cache_max_concurrency", "15.625", id="concurrency"),
        pytest.param("num_gpu_blocks_override", "None", id="fixed-label"),
    ],
)
def test_cache_config_info_derives_labels_from_pod_when_vllm(label: str, expected: str) -> None:
    config = PodConfig(block_size=32, num_gpu_blocks=1000, max_model_len=2048)
    info = next(lab for n, lab, _ in parse_text(render(config)) if n == "vllm:cache_config_info")
    assert len(info) == 37  # vLLM 0.32's CacheConfig label set
    assert info[label] == expected


def test_waiting_by_reason_reports_capacity_when_requests_wait() -> None:
    overrides = Overrides.parse({"num_requests_waiting": 4})
    text = render(PodConfig(), overrides)
    series = {
        lab["reason"]: v
        for n, lab, v in parse_text(text)
        if n == "vllm:num_requests_waiting_by_reason"
    }
    assert series == {"capacity": 4.0, "deferred": 0.0}
