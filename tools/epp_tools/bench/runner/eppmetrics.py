"""What the EPP holds in its flow-control queues during a run, against the configured caps.

``QueueSampler`` polls the EPP's ``/metrics`` every ``interval`` seconds while the workload runs
and keeps the peak of ``llm_d_epp_flow_control_queue_bytes`` and ``..._queue_size``, summed over
the fairness ids of each priority band and over all bands (a gauge seen at poll times only, so
a peak shorter than the interval can be missed). ``byte_caps`` reads the caps the config sets:
``flowControl.maxBytes`` (global; 0 = none) and each band's ``maxBytes`` (upstream's default
1G when a band sets none; ``defaultPriorityBand`` / ``defaultNegativePriorityBand`` for bands
not listed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp
import yaml

from epp.plugin.units import parse_quantity

QUEUE_BYTES = "llm_d_epp_flow_control_queue_bytes"
QUEUE_SIZE = "llm_d_epp_flow_control_queue_size"
DEFAULT_BAND_MAX_BYTES = 1_000_000_000


def parse_queue(text: str) -> dict[str, dict[str, float]]:
    """``{"bytes"|"requests": {priority: value}}`` summed over the other labels."""
    out: dict[str, dict[str, float]] = {"bytes": {}, "requests": {}}
    for line in text.splitlines():
        for name, key in ((QUEUE_BYTES, "bytes"), (QUEUE_SIZE, "requests")):
            if not line.startswith(name + "{"):
                continue
            labels, _, value = line[len(name) + 1 :].rpartition("} ")
            priority = _label(labels, "priority")
            out[key][priority] = out[key].get(priority, 0.0) + float(value)
    return out


def _label(labels: str, name: str) -> str:
    for part in labels.split(","):
        key, _, value = part.partition("=")
        if key.strip() == name:
            return value.strip().strip('"')
    return ""


class QueueSampler:
    """Peaks of the queue gauges, polled in the background (``async with`` around the run)."""

    def __init__(self, url: str, interval: float = 0.25) -> None:
        self.url = url
        self.interval = interval
        self.samples = 0
        self.peak: dict[str, dict[str, float]] = {"bytes": {}, "requests": {}}
        self.peak_total: dict[str, float] = {"bytes": 0.0, "requests": 0.0}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> QueueSampler:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def add(self, reading: Mapping[str, Mapping[str, float]]) -> None:
        self.samples += 1
        for key in ("bytes", "requests"):
            values = reading.get(key, {})
            for priority, value in values.items():
                self.peak[key][priority] = max(self.peak[key].get(priority, 0.0), value)
            self.peak_total[key] = max(self.peak_total[key], sum(values.values()))

    async def _poll(self) -> None:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while True:  # ends when the run cancels it
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(self.url) as r:
                        self.add(parse_queue(await r.text()))
                await asyncio.sleep(self.interval)

    def as_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "peak_bytes": {p: int(v) for p, v in sorted(self.peak["bytes"].items())},
            "peak_requests": {p: int(v) for p, v in sorted(self.peak["requests"].items())},
            "peak_total_bytes": int(self.peak_total["bytes"]),
            "peak_total_requests": int(self.peak_total["requests"]),
        }


def _bytes(value: Any) -> int:
    return parse_quantity(value) if value not in (None, "") else 0


def byte_caps(config_text: str, priorities: list[int]) -> dict[str, int]:
    """``{"global": cap or 0, "<priority>": cap}`` for each of ``priorities``; ``{}`` when the
    config does not turn flow control on."""
    doc = yaml.safe_load(config_text) or {}
    if "flowControl" not in (doc.get("featureGates") or []):
        return {}
    fc = doc.get("flowControl") or {}
    listed = {int(b["priority"]): _bytes(b.get("maxBytes")) for b in fc.get("priorityBands") or []}
    positive = _bytes((fc.get("defaultPriorityBand") or {}).get("maxBytes"))
    negative_spec = fc.get("defaultNegativePriorityBand")
    negative = _bytes((negative_spec or {}).get("maxBytes")) if negative_spec else positive
    caps = {"global": _bytes(fc.get("maxBytes"))}
    for p in priorities:
        cap = listed.get(p) or (negative if p < 0 else positive)
        caps[str(p)] = cap or DEFAULT_BAND_MAX_BYTES
    return caps
