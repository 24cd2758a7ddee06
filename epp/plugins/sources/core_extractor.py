"""``core-metrics-extractor``: model-server Prometheus metrics → ``epp.plugin.Metrics``.

The engine of an endpoint is its label ``engineLabelKey`` (default ``llm-d.ai/engine-type``, then
the legacy ``inference.networking.k8s.io/engine-type``); a missing or unknown engine uses
``defaultEngine``. The engine's specs (see ``epp.plugins.sources.engines``) select the series:

* queue, running, KV usage (0-1), cache block size / block count gauges and custom metrics: among
  the series matching the spec, the one with the greatest timestamp wins (ties and series
  without timestamps: the last one in the payload);
* LoRA (``vllm:lora_requests_info``, whose value is a timestamp): the matching series with the
  largest value; its labels ``running_lora_adapters`` / ``waiting_lora_adapters`` (comma lists,
  trimmed) become ``active_models`` / ``waiting_models`` and ``max_lora`` becomes
  ``max_active_models``. A missing LoRA family is normal (no adapter loaded yet);
* cache info (``vllm:cache_config_info``): labels ``block_size`` / ``num_gpu_blocks`` (or the
  engine's ``cacheBlockSizeLabelName`` / ``cacheNumBlocksLabelName``).

Values absent from the payload keep their previous value, and so do the endpoint attributes other
extractors published (``Metrics.attributes``): the result is always derived from the ``Metrics``
given. ``update_time`` becomes ``now`` when at least one value was read. A payload with none of
the engine's metrics raises ``ValueError`` (the collector counts it as an extract error);
non-finite values are ignored. Each distinct line of a scrape is parsed once and remembered
(``promtext.LineCache``, bounded), so an unchanged line costs a dictionary lookup; a page equal
to the endpoint's previous one, extracted into the ``Metrics`` made of that page, is not parsed
at all: the same values with ``update_time`` now (pages up to 256 KB, for up to 1024 endpoints).

YAML example::

    - type: core-metrics-extractor
      parameters:
        engineLabelKey: llm-d.ai/engine-type
        defaultEngine: vllm
        engineConfigs:
        - name: sglang
          queuedRequestsSpec: sglang:num_queue_reqs
          runningRequestsSpec: sglang:num_running_reqs
          kvUsageSpec: sglang:token_usage
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from epp.plugin import Endpoint, Handle, Metrics, PluginBase
from epp.plugins.sources import promtext
from epp.plugins.sources.engines import EngineConfig, EngineMapping, MetricSpec, build_registry

DEFAULT_ENGINE_LABEL_KEY: Final = "llm-d.ai/engine-type"
LEGACY_ENGINE_LABEL_KEY: Final = "inference.networking.k8s.io/engine-type"

_RUNNING_ADAPTERS: Final = "running_lora_adapters"
_WAITING_ADAPTERS: Final = "waiting_lora_adapters"
_MAX_ADAPTERS: Final = "max_lora"

# Plain gauge specs: (EngineMapping attribute, Metrics field, conversion).
_GAUGES: Final[tuple[tuple[str, str, Callable[[float], Any]], ...]] = (
    ("queued", "waiting_queue_size", int),
    ("running", "running_requests_size", int),
    ("kv_usage", "kv_cache_usage_percent", float),
    ("cache_block_size", "cache_block_size", int),
    ("cache_num_blocks", "cache_num_blocks", int),
)

_Series = Mapping[str, list[promtext.Sample]]

# An endpoint's last page is remembered (to skip parsing when the next one is the same) up to
# this size, for at most this many endpoints (the memory stays bounded).
_REMEMBERED_PAYLOAD_BYTES: Final = 256 * 1024
_REMEMBERED_ENDPOINTS: Final = 1024


class CoreMetricsExtractor(PluginBase):
    """Extracts queue, running, KV usage, LoRA, cache info and custom metrics per engine."""

    TYPE: ClassVar[str] = "core-metrics-extractor"

    @dataclass(frozen=True)
    class Params:
        engine_label_key: str = DEFAULT_ENGINE_LABEL_KEY
        default_engine: str = "vllm"
        engine_configs: tuple[EngineConfig, ...] = ()

        def __post_init__(self) -> None:
            if not self.engine_label_key:
                raise ValueError("engineLabelKey cannot be empty")
            build_registry(self.engine_configs, self.default_engine)

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._registry, self._default = build_registry(params.engine_configs, params.default_engine)
        self._label_key = params.engine_label_key
        # Scrapes repeat mostly the same lines: parse each distinct line once (bounded).
        self._lines = promtext.LineCache()
        # Per endpoint id: the last payload, the engine mapping and the Metrics made of them.
        self._last: dict[str, tuple[bytes, EngineMapping, Metrics]] = {}

    def mapping_for(self, endpoint: Endpoint) -> EngineMapping:
        """The engine mapping an endpoint's labels select (default when absent or unknown)."""
        labels = endpoint.labels
        engine = labels.get(self._label_key) or labels.get(LEGACY_ENGINE_LABEL_KEY)
        if not engine:
            return self._default
        return self._registry.get(engine, self._default)

    def extract(
        self, payload: bytes, endpoint: Endpoint, previous: Metrics, *, now: float
    ) -> Metrics:
        mapping = self.mapping_for(endpoint)
        last = self._last.get(endpoint.id)
        if last is not None and last[2] is previous and last[1] is mapping and last[0] == payload:
            # The page this Metrics was made of, again: the same values, read now.
            result = dataclasses.replace(previous, update_time=now)
            self._last[endpoint.id] = (last[0], mapping, result)
            return result
        result = self._extract(payload, endpoint, mapping, previous, now)
        if result is not previous and len(payload) <= _REMEMBERED_PAYLOAD_BYTES:
            if len(self._last) >= _REMEMBERED_ENDPOINTS and endpoint.id not in self._last:
                self._last.clear()
            self._last[endpoint.id] = (payload, mapping, result)
        return result

    def _extract(
        self,
        payload: bytes,
        endpoint: Endpoint,
        mapping: EngineMapping,
        previous: Metrics,
        now: float,
    ) -> Metrics:
        families = self._lines.parse(payload, mapping.wanted)
        updates: dict[str, Any] = {}
        for attr, field_name, convert in _GAUGES:
            spec: MetricSpec | None = getattr(mapping, attr)
            value = _latest_value(spec, families)
            if value is not None:
                updates[field_name] = convert(value)
        _cache_info(mapping, families, updates)
        _lora(mapping.lora, families, updates)
        custom = _custom(mapping, families)
        if custom:
            updates["custom"] = {**previous.custom, **custom}
        if not updates:
            if _expects_something(mapping):
                raise ValueError(
                    f"no {mapping.name} metrics found in payload of {endpoint.id} "
                    f"(looked for {', '.join(sorted(mapping.wanted))}; "
                    f"{families.skipped} malformed lines)"
                )
            return previous
        return dataclasses.replace(previous, update_time=now, **updates)


def _expects_something(mapping: EngineMapping) -> bool:
    # The LoRA family alone is optional, so an engine with nothing else expects nothing.
    lora = {mapping.lora.name} if mapping.lora is not None else set()
    return bool(mapping.wanted - lora)


def _matching(spec: MetricSpec, families: _Series) -> list[promtext.Sample]:
    return [s for s in families.get(spec.name, ()) if spec.matches(s)]


def _latest(spec: MetricSpec | None, families: _Series) -> promtext.Sample | None:
    """The matching series with the greatest timestamp; the last one on ties or no timestamps."""
    if spec is None:
        return None
    best: promtext.Sample | None = None
    best_ts = -1
    for sample in _matching(spec, families):
        ts = -1 if sample.timestamp_ms is None else sample.timestamp_ms
        if ts >= best_ts:
            best, best_ts = sample, ts
    return best


def _latest_value(spec: MetricSpec | None, families: _Series) -> float | None:
    sample = _latest(spec, families)
    if sample is None or not math.isfinite(sample.value):
        return None
    return sample.value


def _label_int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def _cache_info(mapping: EngineMapping, families: _Series, updates: dict[str, Any]) -> None:
    sample = _latest(mapping.cache_info, families)
    if sample is None:
        return
    block_size = _label_int(sample.labels, mapping.cache_block_size_label)
    num_blocks = _label_int(sample.labels, mapping.cache_num_blocks_label)
    if block_size is not None:
        updates["cache_block_size"] = block_size
    if num_blocks is not None:
        updates["cache_num_blocks"] = num_blocks


def _lora(spec: MetricSpec | None, families: _Series, updates: dict[str, Any]) -> None:
    if spec is None:
        return
    best: promtext.Sample | None = None
    for sample in _matching(spec, families):
        # The value is the time the series was created: the newest describes the current state.
        if best is None or sample.value > best.value:
            best = sample
    if best is None:
        return
    updates["active_models"] = _adapters(best.labels.get(_RUNNING_ADAPTERS, ""))
    updates["waiting_models"] = _adapters(best.labels.get(_WAITING_ADAPTERS, ""))
    max_lora = _label_int(best.labels, _MAX_ADAPTERS)
    if max_lora is not None:
        updates["max_active_models"] = max_lora


def _adapters(csv: str) -> frozenset[str]:
    return frozenset(name for part in csv.split(",") if (name := part.strip()))


def _custom(mapping: EngineMapping, families: _Series) -> dict[str, float]:
    found: dict[str, float] = {}
    for key, spec in mapping.custom:
        value = _latest_value(spec, families)
        if value is not None:
            found[key] = value
    return found
