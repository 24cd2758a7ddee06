"""Prometheus text exposition of one simulated pod, with vLLM's or SGLang's metric names.

The names, types and labels are data (``VLLM_NAMES`` / ``SGLANG_NAMES``), not branches. For
vLLM (0.32) every series carries ``engine="0"`` and ``model_name="<base model>"`` (LoRA requests
are reported under the base model, as vLLM does), except ``vllm:lora_requests_info`` whose labels
are exactly ``max_lora``, ``running_lora_adapters`` and ``waiting_lora_adapters`` and whose value
is a unix timestamp. Like vLLM, label sets seen earlier stay in the output with their last
timestamp, so a reader must take the series with the largest value. That family is only present
when LoRA adapters are configured.

vLLM exports through ``prometheus_client``, so every counter and histogram is followed by a
``<name>_created`` gauge family (same labels, the creation time as value; a counter's TYPE line
keeps its ``_total`` suffix), ``vllm:request_success_total`` lists all five finish reasons from the
start (``abort`` stays 0: vLLM does not count aborted requests there), and
``vllm:cache_config_info`` carries the full label set of vLLM 0.32's ``CacheConfig``. The test
``tests/vllm/test_real_vllm.py`` compares all of this with a real vLLM server.

The text is rendered directly (no prometheus_client registry): it is cheap and keeps pods
independent. Overrides from ``/sim/overrides`` replace the engine's live values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Overrides
from epp_tools.sim.engine import Engine
from epp_tools.sim.stats import Histogram

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
    waiting_by_reason: str | None
    created_series: bool  # prometheus_client's ``_created`` companions of counters/histograms
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
    waiting_by_reason="vllm:num_requests_waiting_by_reason",
    created_series=True,
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
    waiting_by_reason=None,
    created_series=False,
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
_WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
    "status). Sum of all reasons equals vllm:num_requests_waiting."
)
# vLLM 0.32's finish reasons, all exported from start-up.
_VLLM_FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
_UNCOUNTED_FINISH_REASONS = frozenset({"abort"})
# Fixed labels of vllm:cache_config_info (vLLM 0.32 defaults on a GPU); the ones that depend on
# the pod's configuration are filled in by MetricsRenderer._cache_labels.
_VLLM_CACHE_INFO_FIXED: tuple[tuple[str, str], ...] = (
    ("_block_size_resolved", "True"),
    ("cache_dtype", "auto"),
    ("cache_hit_alignment_tokens", "None"),
    ("enable_mamba_shared_prefix_checkpoint", "False"),
    ("enable_prefix_caching", "True"),
    ("engine", "0"),
    ("gpu_memory_utilization", "0.92"),
    ("hash_block_size", "None"),
    ("is_attention_free", "False"),
    ("kv_cache_dtype_skip_layers", "[]"),
    ("kv_cache_layout", "None"),
    ("kv_offloading_backend", "native"),
    ("kv_offloading_size", "None"),
    ("kv_sharing_fast_prefill", "False"),
    ("mamba_block_size", "None"),
    ("mamba_cache_dtype", "auto"),
    ("mamba_cache_mode", "none"),
    ("mamba_page_size_padded", "None"),
    ("mamba_ssm_cache_dtype", "auto"),
    ("num_cpu_blocks", "None"),
    ("num_gpu_blocks_override", "None"),
    ("prefix_cache_retention_interval", "0"),
    ("prefix_caching_hash_algo", "sha256"),
    ("prefix_match_unit", "None"),
    ("replayssm_buffer_len", "16"),
    ("skip_page_size_padded", "None"),
    ("sliding_window", "None"),
    ("swa_bounded_replay", "True"),
    ("use_kda_recoverssm", "False"),
    ("use_replayssm", "False"),
    ("user_specified_block_size", "True"),
)
# KV bytes per token of the modelled 8B model: 2 (K,V) x 32 layers x 8 heads x 128 dims x 2 bytes.
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


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


def _created_name(name: str) -> str:
    return name.removesuffix("_total") + "_created"


class _Writer:
    def __init__(self, created: float | None = None) -> None:
        self.lines: list[str] = []
        self.created = created  # None: no ``_created`` companions (not prometheus_client)

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
        if kind == "counter":
            self.created_family(name, help_text, [labels])

    def created_family(
        self, name: str, help_text: str, label_sets: Iterable[Mapping[str, str]]
    ) -> None:
        if self.created is None:
            return
        created = _created_name(name)
        self.family(created, "gauge", help_text)
        for labels in label_sets:
            self.sample(created, labels, self.created)

    def histogram(
        self, name: str, help_text: str, labels: Mapping[str, str], hist: Histogram
    ) -> None:
        self.family(name, "histogram", help_text)
        for bound, count in zip(hist.buckets, hist.cumulative(), strict=True):
            self.sample(f"{name}_bucket", {**labels, "le": _fmt(bound)}, count)
        self.sample(f"{name}_bucket", {**labels, "le": "+Inf"}, hist.count)
        self.sample(f"{name}_count", labels, hist.count)
        self.sample(f"{name}_sum", labels, hist.total)
        self.created_family(name, help_text, [labels])

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class MetricsRenderer:
    """Renders ``/metrics`` for one pod; remembers past LoRA label sets like vLLM's registry."""

    def __init__(self, config: PodConfig) -> None:
        self.config = config
        self.names = NAMES_BY_ENGINE[config.engine]
        self._lora_seen: OrderedDict[tuple[str, str, str], float] = OrderedDict()
        self._created: float | None = None  # wall time of the first render

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
        if self._created is None:
            self._created = wall_time
        w = _Writer(self._created if names.created_series else None)
        for field, kind, help_text in _SCALARS:
            name = getattr(names, field)
            if name:
                w.scalar(name, kind, help_text, base, values[field])
            if field == "waiting" and names.waiting_by_reason:
                deferred = engine.num_transferring if overrides.num_requests_waiting is None else 0
                self._waiting_by_reason(
                    w, names.waiting_by_reason, base, values["waiting"], deferred
                )
        w.scalar(names.cache_info, "gauge", _CACHE_INFO_HELP, self._cache_labels(), 1.0)
        if names.lora_info and self.config.lora_enabled:
            self._lora_info(w, names.lora_info, engine, overrides, wall_time)
        if names.request_success:
            self._request_success(w, names.request_success, base, stats.finished)
        w.histogram(names.ttft, "Histogram of time to first token in seconds.", base, stats.ttft)
        w.histogram(names.itl, "Histogram of inter-token latency in seconds.", base, stats.itl)
        w.histogram(names.e2e, "Histogram of e2e request latency in seconds.", base, stats.e2e)
        return w.text()

    @staticmethod
    def _waiting_by_reason(
        w: _Writer, name: str, base: Mapping[str, str], waiting: float, deferred: int
    ) -> None:
        # Deferred = waiting for KV from a prefill pod (P/D); every other one waits for capacity.
        w.family(name, "gauge", _WAITING_BY_REASON_HELP)
        w.sample(name, {**base, "reason": "capacity"}, waiting - deferred)
        w.sample(name, {**base, "reason": "deferred"}, float(deferred))

    @staticmethod
    def _request_success(
        w: _Writer, name: str, base: Mapping[str, str], finished: Mapping[str, int]
    ) -> None:
        help_text = "Count of successfully processed requests."
        label_sets = [{**base, "finished_reason": r} for r in _VLLM_FINISH_REASONS]
        w.family(name, "counter", help_text)
        for labels in label_sets:
            reason = labels["finished_reason"]
            count = 0 if reason in _UNCOUNTED_FINISH_REASONS else finished.get(reason, 0)
            w.sample(name, labels, count)
        w.created_family(name, help_text, label_sets)

    def _cache_labels(self) -> dict[str, str]:
        cfg, names = self.config, self.names
        labels = {
            names.cache_block_size_label: str(cfg.block_size),
            names.cache_num_blocks_label: str(cfg.num_gpu_blocks),
        }
        if cfg.engine == "vllm":
            tokens = cfg.block_size * cfg.num_gpu_blocks
            labels.update(_VLLM_CACHE_INFO_FIXED)
            labels.update(
                effective_attention_block_size=str(cfg.block_size),
                kv_cache_size_tokens=str(tokens),
                kv_cache_memory_bytes=str(tokens * _KV_BYTES_PER_TOKEN),
                kv_cache_max_concurrency=_fmt(tokens / cfg.max_model_len),
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
