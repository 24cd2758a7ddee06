"""Model-server metric names per engine, as data.

Each engine is an ``EngineConfig`` whose fields are the upstream ``engineConfigs`` keys
(camelCase in YAML). Spec strings use the syntax ``name{label=value,...}``; quotes around label
values are optional and only equality matchers are allowed. An empty spec disables that metric.

Built-in engines (the ``BUILTIN_ENGINES`` table)::

    engine               queued / running / KV usage (0-1) / LoRA / cache info
    vllm                 vllm:num_requests_waiting, vllm:num_requests_running,
                         vllm:kv_cache_usage_perc, vllm:lora_requests_info,
                         vllm:cache_config_info (labels block_size, num_gpu_blocks)
    sglang               sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage,
                         -, sglang:cache_config_info (labels page_size, num_pages)
    trtllm-serve         trtllm_num_requests_waiting, trtllm_num_requests_running,
                         trtllm_kv_cache_utilization, -, gauges trtllm_kv_cache_tokens_per_block
                         and trtllm_kv_cache_max_blocks
    triton-tensorrt-llm  nv_trt_llm_request_metrics{request_type=waiting|scheduled},
                         nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}, -,
                         ...{kv_cache_block_type=tokens_per} and ...{kv_cache_block_type=max}
    triton               nv_inference_pending_request_count, nv_inference_exec_count

YAML example (an ``engineConfigs`` entry of ``core-metrics-extractor``)::

    engineConfigs:
    - name: my-engine
      queuedRequestsSpec: my_queue{kind="waiting"}
      runningRequestsSpec: my_running
      kvUsageSpec: my_kv_usage
      customMetrics:
      - attributeKey: gpu-temp
        metricSpec: my_gpu_temperature{gpu=0}
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from epp.plugins.sources.promtext import Sample

RESERVED_ENGINE_NAME: Final = "default"
DEFAULT_CACHE_BLOCK_SIZE_LABEL: Final = "block_size"
DEFAULT_CACHE_NUM_BLOCKS_LABEL: Final = "num_gpu_blocks"

_SPEC: Final = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*", re.DOTALL)
_MATCHER: Final = re.compile(
    # An unquoted value may not start with "~" so a regex matcher ("=~") is not read as "=".
    r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*(\"(?:[^\"\\]|\\.)*\"|[^\",}\s~][^\",}\s]*)\s*(?:,|$)",
    re.DOTALL,
)
_UNQUOTE: Final = re.compile(r"\\(.)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """A series selector: metric name plus label equalities the series must carry."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)

    def matches(self, sample: Sample) -> bool:
        labels = sample.labels
        return all(labels.get(key) == value for key, value in self.labels.items())

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels.items())
        return f"{self.name}{{{inner}}}"


def parse_spec(text: str) -> MetricSpec | None:
    """Parse ``name{label=value,...}``; an empty string means "disabled" (None)."""
    if not text.strip():
        return None
    match = _SPEC.fullmatch(text)
    if match is None:
        raise ValueError(f"invalid metric spec {text!r}: expected name{{label=value,...}}")
    labels: dict[str, str] = {}
    body = (match.group(2) or "").strip()
    pos = 0
    while pos < len(body):
        item = _MATCHER.match(body, pos)
        if item is None:
            raise ValueError(
                f"invalid metric spec {text!r}: label matchers must be label=value "
                "(only equality is supported)"
            )
        key, raw = item.group(1), item.group(2)
        if raw.startswith('"'):
            raw = _UNQUOTE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), raw[1:-1])
        if key in labels:
            raise ValueError(f"invalid metric spec {text!r}: label {key!r} given twice")
        labels[key] = raw
        pos = item.end()
    return MetricSpec(name=match.group(1), labels=labels)


@dataclass(frozen=True)
class CustomMetric:
    """``customMetrics[]`` entry: the value of ``metric_spec`` lands in ``Metrics.custom``."""

    attribute_key: str = ""
    metric_spec: str = ""

    def __post_init__(self) -> None:
        if not self.attribute_key:
            raise ValueError("customMetrics: attributeKey cannot be empty")
        if parse_spec(self.metric_spec) is None:
            raise ValueError(f"customMetrics: {self.attribute_key!r} metricSpec cannot be empty")


@dataclass(frozen=True)
class EngineConfig:
    """One engine's metric specs (an ``engineConfigs`` entry)."""

    name: str = ""
    queued_requests_spec: str = ""
    running_requests_spec: str = ""
    kv_usage_spec: str = ""
    lora_spec: str = ""
    cache_info_spec: str = ""
    cache_block_size_label_name: str = ""
    cache_num_blocks_label_name: str = ""
    cache_block_size_spec: str = ""
    cache_num_blocks_spec: str = ""
    custom_metrics: tuple[CustomMetric, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("engine config name cannot be empty")
        if self.name == RESERVED_ENGINE_NAME:
            raise ValueError(f"engine config name cannot be {RESERVED_ENGINE_NAME!r} (reserved)")
        keys = [c.attribute_key for c in self.custom_metrics]
        duplicated = sorted({k for k in keys if keys.count(k) > 1})
        if duplicated:
            raise ValueError(
                f"engine {self.name!r}: customMetrics attributeKey {duplicated[0]!r} is duplicated"
            )
        try:
            EngineMapping.build(self)
        except ValueError as exc:
            raise ValueError(f"engine {self.name!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class EngineMapping:
    """An ``EngineConfig`` with its specs parsed, ready for extraction. ``wanted`` is the set of
    series names the extractor asks the parser for."""

    name: str
    queued: MetricSpec | None
    running: MetricSpec | None
    kv_usage: MetricSpec | None
    lora: MetricSpec | None
    cache_info: MetricSpec | None
    cache_block_size_label: str
    cache_num_blocks_label: str
    cache_block_size: MetricSpec | None
    cache_num_blocks: MetricSpec | None
    custom: tuple[tuple[str, MetricSpec], ...]
    wanted: frozenset[str]

    @classmethod
    def build(cls, config: EngineConfig) -> EngineMapping:
        custom = tuple(
            (c.attribute_key, spec)
            for c in config.custom_metrics
            if (spec := parse_spec(c.metric_spec)) is not None
        )
        queued = parse_spec(config.queued_requests_spec)
        running = parse_spec(config.running_requests_spec)
        kv_usage = parse_spec(config.kv_usage_spec)
        lora = parse_spec(config.lora_spec)
        cache_info = parse_spec(config.cache_info_spec)
        block_size = parse_spec(config.cache_block_size_spec)
        num_blocks = parse_spec(config.cache_num_blocks_spec)
        specs = (queued, running, kv_usage, lora, cache_info, block_size, num_blocks)
        names = {s.name for s in specs if s is not None} | {s.name for _, s in custom}
        return cls(
            name=config.name,
            queued=queued,
            running=running,
            kv_usage=kv_usage,
            lora=lora,
            cache_info=cache_info,
            cache_block_size_label=(
                config.cache_block_size_label_name or DEFAULT_CACHE_BLOCK_SIZE_LABEL
            ),
            cache_num_blocks_label=(
                config.cache_num_blocks_label_name or DEFAULT_CACHE_NUM_BLOCKS_LABEL
            ),
            cache_block_size=block_size,
            cache_num_blocks=num_blocks,
            custom=custom,
            wanted=frozenset(names),
        )


BUILTIN_ENGINES: Final[tuple[EngineConfig, ...]] = (
    EngineConfig(
        name="vllm",
        queued_requests_spec="vllm:num_requests_waiting",
        running_requests_spec="vllm:num_requests_running",
        kv_usage_spec="vllm:kv_cache_usage_perc",
        lora_spec="vllm:lora_requests_info",
        cache_info_spec="vllm:cache_config_info",
    ),
    EngineConfig(
        name="sglang",
        queued_requests_spec="sglang:num_queue_reqs",
        running_requests_spec="sglang:num_running_reqs",
        kv_usage_spec="sglang:token_usage",
        cache_info_spec="sglang:cache_config_info",
        cache_block_size_label_name="page_size",
        cache_num_blocks_label_name="num_pages",
    ),
    EngineConfig(
        name="trtllm-serve",
        queued_requests_spec="trtllm_num_requests_waiting",
        running_requests_spec="trtllm_num_requests_running",
        kv_usage_spec="trtllm_kv_cache_utilization",
        cache_block_size_spec="trtllm_kv_cache_tokens_per_block",
        cache_num_blocks_spec="trtllm_kv_cache_max_blocks",
    ),
    EngineConfig(
        name="triton-tensorrt-llm",
        queued_requests_spec="nv_trt_llm_request_metrics{request_type=waiting}",
        running_requests_spec="nv_trt_llm_request_metrics{request_type=scheduled}",
        kv_usage_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        cache_block_size_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
        cache_num_blocks_spec="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
    ),
    EngineConfig(
        name="triton",
        queued_requests_spec="nv_inference_pending_request_count",
        running_requests_spec="nv_inference_exec_count",
    ),
)


def build_registry(
    overrides: tuple[EngineConfig, ...], default_engine: str
) -> tuple[dict[str, EngineMapping], EngineMapping]:
    """Merge user configs over the built-ins (same name replaces); return (by name, default)."""
    configs = {c.name: c for c in BUILTIN_ENGINES}
    user_names: set[str] = set()
    for config in overrides:
        if config.name in user_names:
            raise ValueError(f"engineConfigs: engine {config.name!r} is defined twice")
        user_names.add(config.name)
        configs[config.name] = config
    registry = {name: EngineMapping.build(c) for name, c in configs.items()}
    if default_engine not in registry:
        raise ValueError(
            f"defaultEngine {default_engine!r} not found in engineConfigs "
            f"(known: {', '.join(sorted(registry))})"
        )
    return registry, registry[default_engine]
