"""Test-control state of a simulated pod: pinned metric values and injected faults.

``POST /sim/overrides`` pins what ``/metrics`` reports (any subset; ``{}`` clears)::

    {"num_requests_waiting": 3, "num_requests_running": 1, "kv_cache_usage_perc": 0.2,
     "running_lora_adapters": ["a"], "waiting_lora_adapters": [], "max_lora": 2}

``POST /sim/faults`` injects failures (any subset; ``{}`` clears)::

    {"slow_ms": 500,                   # wall-clock delay before answering (not time-scaled)
     "error_rate": 0.5,                # share of inference requests answered with error_status
     "error_status": 503,              # default 503
     "drop_connection_rate": 0.1,      # share of inference requests whose connection is cut
     "stall_metrics": true,            # /metrics hangs until the fault is cleared (max 60 s)
     "die_mid_stream_after_chunks": 3, # streams are cut after this many SSE chunks
     "metrics_delay_ms": 300,          # /metrics only: wall-clock delay before answering
     "metrics_status": 503,            # /metrics only: answered with this status, empty body
     "metrics_garbage": true,          # /metrics only: 200 with bytes that are no metrics page
     "black_hole": true}               # every request (inference and /metrics) is accepted and
                                       # never answered until the fault is cleared (max 60 s)

Faults apply to the inference endpoints (completions, chat, responses); ``slow_ms`` also delays
``/metrics``; the ``metrics_*`` faults apply to ``/metrics`` only. Decisions use the pod's
seeded random generator, so a run is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any


def _number(value: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number")
    if not lo <= value <= hi:
        raise ValueError(f"{key} must be in [{lo}, {hi}]")
    return float(value)


def _count(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value


def _names(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key} must be a list of strings")
    return tuple(value)


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be a boolean")
    return value


def _parse(cls: type[Any], body: Any, parsers: Mapping[str, Callable[[Any, str], Any]]) -> Any:
    if not isinstance(body, Mapping):
        raise ValueError("the body must be a JSON object")
    unknown = sorted(set(body) - set(parsers))
    if unknown:
        raise ValueError(f"unknown keys: {', '.join(unknown)}")
    return cls(**{k: parsers[k](v, k) for k, v in body.items()})


@dataclass(frozen=True)
class Overrides:
    num_requests_waiting: int | None = None
    num_requests_running: int | None = None
    kv_cache_usage_perc: float | None = None
    running_lora_adapters: tuple[str, ...] | None = None
    waiting_lora_adapters: tuple[str, ...] | None = None
    max_lora: int | None = None

    @classmethod
    def parse(cls, body: Any) -> Overrides:
        parsers: dict[str, Callable[[Any, str], Any]] = {
            "num_requests_waiting": _count,
            "num_requests_running": _count,
            "kv_cache_usage_perc": lambda v, k: _number(v, k, 0.0, 1.0),
            "running_lora_adapters": _names,
            "waiting_lora_adapters": _names,
            "max_lora": _count,
        }
        result: Overrides = _parse(cls, body, parsers)
        return result

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class Faults:
    slow_ms: float = 0.0
    error_rate: float = 0.0
    error_status: int = 503
    drop_connection_rate: float = 0.0
    stall_metrics: bool = False
    die_mid_stream_after_chunks: int | None = None
    metrics_delay_ms: float = 0.0
    metrics_status: int = 0
    metrics_garbage: bool = False
    black_hole: bool = False

    @property
    def holds_requests(self) -> bool:
        """Some request waits for the fault to be cleared."""
        return self.stall_metrics or self.black_hole

    @classmethod
    def parse(cls, body: Any) -> Faults:
        parsers: dict[str, Callable[[Any, str], Any]] = {
            "slow_ms": lambda v, k: _number(v, k, 0.0, 600_000.0),
            "error_rate": lambda v, k: _number(v, k, 0.0, 1.0),
            "error_status": lambda v, k: int(_number(v, k, 400, 599)),
            "drop_connection_rate": lambda v, k: _number(v, k, 0.0, 1.0),
            "stall_metrics": _flag,
            "die_mid_stream_after_chunks": _count,
            "metrics_delay_ms": lambda v, k: _number(v, k, 0.0, 600_000.0),
            "metrics_status": lambda v, k: int(_number(v, k, 400, 599)),
            "metrics_garbage": _flag,
            "black_hole": _flag,
        }
        result: Faults = _parse(cls, body, parsers)
        return result

    def as_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
