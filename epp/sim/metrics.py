"""Prometheus text exposition of one simulated pod, with vLLM's or SGLang's metric names.

The names, types and labels are data (``VLLM_NAMES`` / ``SGLANG_NAMES``), not branches. For
vLLM (0.32) every series carries ``engine="0"`` and ``model_name="<base model>"`` (LoRA requests
are reported under the base model, as vLLM does), except ``vllm:lora_requests_info`` whose labels
are exactly ``max_lora``, ``running_lora_adapters`` and ``waiting_lora_adapters`` and whose value
is a unix timestamp. Like vLLM, label sets seen earlier stay in the output with their last
timestamp, so a reader must take the series with the largest value. That family is only present
when LoRA adapters are configured.

The text is rendered directly (no prometheus_client registry): it is cheap and keeps pods
independent. Overrides from ``/sim/overrides`` replace the engine's live values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from epp.sim.config import PodConfig
from epp.sim.control import Overrides
from epp.sim.engine import Engine
from epp.sim.stats import Histogram

T = TypeVar("T")

_LORA_HISTORY = 8  # distinct lora label sets kept in the output


@dataclass(frozen=True)
class EngineMetricNames:
    running: str
    waiting: str
    kv_usage: str
    cache_info: str
    cache_block_size_label: str
    cache_num_blocks_label: str
    prompt_tokens: str
    generation_tokens: str
    ttft: str
    itl: str
    e2e: str
    request_success: str | None
    prefix_queries: str | None
    prefix_hits: str | None
    preemptions: str | None
    lora_info: str | None
    base_labels: tuple[tuple[str, str], ...]  # (label, "model"|literal) pairs; see _base_labels


VLLM_NAMES = EngineMetricNames(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    cache_info="vllm:cache_config_info",
    cache_block_size_label="block_size",
    cache_num_blocks_label="num_gpu_blocks",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    e2e="vllm:e2e_request_latency_seconds",
    request_success="vllm:request_success_total",
    prefix_queries="vllm:prefix_cache_queries_total",
    prefix_hits="vllm:prefix_cache_hits_total",
    preemptions="vllm:num_preemptions_total",
    lora_info="vllm:lora_requests_info",
    base_labels=(("engine", "0"), ("model_name", "{model}")),
)

SGLANG_NAMES = EngineMetricNames(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    cache_info="sglang:cache_config_info",
    cache_block_size_label="page_size",
    cache_num_blocks_label="num_pages",
    prompt_tokens="sglang:prompt_tokens_total",
    generation_tokens="sglang:generation_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    request_success=None,
    prefix_queries=None,
    prefix_hits=None,
    preemptions=None,
    lora_info=None,
    base_labels=(("model_name", "{model}"),),
)

NAMES_BY_ENGINE: Mapping[str, EngineMetricNames] = {"vllm": VLLM_NAMES, "sglang": SGLANG_NAMES}


# (EngineMetricNames field, type, help) of the single-series families, in output order
_SCALARS: tuple[tuple[str, str, str], ...] = (
    ("running", "gauge", "Number of requests in model execution batches."),
    ("waiting", "gauge", "Number of requests waiting to be processed."),
    ("kv_usage", "gauge", "KV-cache usage. 1 means 100 percent usage."),
    ("prefix_queries", "counter", "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_hits", "counter", "Prefix cache hits, in terms of number of cached tokens."),
    ("preemptions", "counter", "Cumulative number of preemption from the engine."),
    ("prompt_tokens", "counter", "Number of prefill tokens processed."),
    ("generation_tokens", "counter", "Number of generation tokens processed."),
)
_CACHE_INFO_HELP = "Information of the LLMEngine CacheConfig"


def _fmt(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Mapping[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_fmt(value)}")

    def scalar(
        self, name: str, kind: str, help_text: str, labels: Mapping[str, str], value: float
    ) -> None:
        self.family(name, kind, help_text)
        self.sample(name, labels, value)

    def histogram(
        self, name: str, help_text: str, labels: Mapping[str, str], hist: Histogram
    ) -> None:
        self.family(name, "histogram", help_text)
        for bound, count in zip(hist.buckets, hist.cumulative(), strict=True):
            self.sample(f"{name}_bucket", {**labels, "le": _fmt(bound)}, count)
        self.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, hist.count)
        self.sample(f"{name}_count", labels, hist.count)
        self.sample(f"{name}_sum", labels, hist.total)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class MetricsRenderer:
    """Renders ``/metrics`` for one pod; remembers past LoRA label sets like vLLM's registry."""

    def __init__(self, config: PodConfig) -> None:
        self.config = config
        self.names = NAMES_BY_ENGINE[config.engine]
        self._lora_seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def _base_labels(self) -> dict[str, str]:
        return {k: v.format(model=self.config.model) for k, v in self.names.base_labels}

    def render(self, engine: Engine, overrides: Overrides, wall_time: float) -> str:
        names, base, stats = self.names, self._base_labels(), engine.stats
        values: dict[str, float] = {
            "running": _pick(overrides.num_requests_running, engine.num_running),
            "waiting": _pick(overrides.num_requests_waiting, engine.num_waiting),
            "kv_usage": _pick(overrides.kv_cache_usage_perc, engine.kv_usage),
            "prefix_queries": stats.prefix_queries,
            "prefix_hits": stats.prefix_hits,
            "preemptions": stats.preemptions,
            "prompt_tokens": stats.prompt_tokens,
            "generation_tokens": stats.generation_tokens,
        }
        w = _Writer()
        for field, kind, help_text in _SCALARS:
            name = getattr(names, field)
            if name:
                w.scalar(name, kind, help_text, base, values[field])
        w.scalar(names.cache_info, "gauge", _CACHE_INFO_HELP, self._cache_labels(), 1.0)
        if names.lora_info and self.config.lora_enabled:
            self._lora_info(w, names.lora_info, engine, overrides, wall_time)
        if names.request_success:
            w.family(names.request_success, "counter", "Count of successfully processed requests.")
            for reason, count in stats.finished.items():
                if reason != "abort":
                    w.sample(names.request_success, {**base, "finished_reason": reason}, count)
        w.histogram(names.ttft, "Histogram of time to first token in seconds.", base, stats.ttft)
        w.histogram(names.itl, "Histogram of inter-token latency in seconds.", base, stats.itl)
        w.histogram(names.e2e, "Histogram of e2e request latency in seconds.", base, stats.e2e)
        return w.text()

    def _cache_labels(self) -> dict[str, str]:
        cfg, names = self.config, self.names
        labels = {
            names.cache_block_size_label: str(cfg.block_size),
            names.cache_num_blocks_label: str(cfg.num_gpu_blocks),
        }
        if cfg.engine == "vllm":
            labels.update(
                engine="0",
                cache_dtype="auto",
                enable_prefix_caching="True",
                gpu_memory_utilization="0.9",
                num_cpu_blocks="None",
                prefix_caching_hash_algo="sha256",
                kv_cache_size_tokens=str(cfg.block_size * cfg.num_gpu_blocks),
            )
        else:
            labels["model_name"] = cfg.model
        return labels

    def _lora_info(
        self, w: _Writer, name: str, engine: Engine, overrides: Overrides, wall_time: float
    ) -> None:
        run = _pick(overrides.running_lora_adapters, tuple(engine.running_loras()))
        wait = _pick(overrides.waiting_lora_adapters, tuple(engine.waiting_loras()))
        max_lora = _pick(overrides.max_lora, self.config.max_loras)
        key = (str(max_lora), ",".join(run), ",".join(wait))
        self._lora_seen.pop(key, None)
        self._lora_seen[key] = wall_time
        while len(self._lora_seen) > _LORA_HISTORY:
            self._lora_seen.popitem(last=False)
        w.family(name, "gauge", "Running stats on lora requests.")
        for (ml, r, q), ts in self._lora_seen.items():
            labels = {"max_lora": ml, "running_lora_adapters": r, "waiting_lora_adapters": q}
            w.sample(name, labels, ts)


def _pick(override: T | None, live: T) -> T:
    return live if override is None else override


def parse_text(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """Minimal reader of the exposition format (used by tests and the benchmark)."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: dict[str, str] = {}
        for part in _split_labels(rest.rstrip("}")):
            k, _, v = part.partition("=")
            labels[k] = v.strip('"')
        yield name, labels, float(value)


def _split_labels(inner: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    quoted = False
    for ch in inner:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    if buf:
        parts.append("".join(buf))
    return parts
