"""Foreign load: traffic one pod serves that the router under test never sees.

A workload with a ``ForeignLoad`` (``b-foreign``) keeps one pod busy with requests the driver
sends straight to that pod's port, bypassing Envoy and the router, while the workload's own
requests go through the target. The router can only learn that the pod is busy from the pod
itself (its ``/metrics``: ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, KV
usage), never from its own in-flight counts.

How the queue is held at about ``waiting`` requests: a closed loop of ``max_num_seqs +
waiting`` workers, each sending one request after the other, so the pod's batch is full and
``waiting`` more stand in its queue; a finished request is replaced at once (a request of the
target sent to that pod queues behind them). Every foreign request is a non-streamed chat
completion with a prompt of its own (``prompt_words`` words after a unique serial number, so
nothing is shared with the workload or between foreign requests) and ``max_tokens`` output
tokens.

``start`` launches the workers and waits (at most ``settle_timeout`` s) until the pod reports at
least ``waiting - 2`` waiting requests; ``begin`` starts the measured window; a sampler reads the
pod's ``/sim/stats`` every ``SAMPLE_S`` seconds, so the report shows the queue the target
actually faced (mean and max waiting, mean running); ``stop`` cancels everything (bounded) and
returns those numbers with the requests sent, served and failed in the window. Every loop is
bounded: each worker by ``MAX_REQUESTS_PER_WORKER`` requests, each request by
``REQUEST_TIMEOUT_S``, the sampler by ``MAX_SAMPLES`` samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from epp_tools.bench.workloads.spec import MODEL, ForeignLoad
from epp_tools.bench.workloads.text import words

SAMPLE_S = 0.25
MAX_SAMPLES = 20_000
MAX_REQUESTS_PER_WORKER = 100_000
REQUEST_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 5.0


@dataclass
class _Window:
    sent: int = 0
    served: int = 0
    failed: int = 0
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)


class ForeignTraffic:
    def __init__(self, spec: ForeignLoad, pod_url: str, max_num_seqs: int, seed: int = 1) -> None:
        self.spec = spec
        self.pod_url = pod_url
        self.workers = max_num_seqs + spec.waiting
        self._rng = random.Random(seed * 6_151 + 3)
        self._serial = 0
        self._window = _Window()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: aiohttp.ClientSession | None = None

    def _body(self) -> dict[str, Any]:
        self._serial += 1
        text = f"foreign {self._serial:07d} " + words(self._rng, self.spec.prompt_words)
        return {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": self.spec.max_tokens,
            "stream": False,
        }

    async def _worker(self, http: aiohttp.ClientSession) -> None:
        for _ in range(MAX_REQUESTS_PER_WORKER):
            self._window.sent += 1
            ok = False
            try:
                async with http.post(f"{self.pod_url}/v1/chat/completions", json=self._body()) as r:
                    await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                self._window.served += 1
            else:
                self._window.failed += 1
                await asyncio.sleep(0.05)  # a refusing pod is not hammered

    async def _stats(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        async with http.get(f"{self.pod_url}/sim/stats") as r:
            data: dict[str, Any] = await r.json()
            return data

    async def _sampler(self, http: aiohttp.ClientSession) -> None:
        for _ in range(MAX_SAMPLES):
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                stats = await self._stats(http)
                self._window.waiting.append(int(stats.get("waiting", 0)))
                self._window.running.append(int(stats.get("running", 0)))
            await asyncio.sleep(SAMPLE_S)

    async def start(self, settle_timeout: float = 15.0) -> None:
        """Launch the workers and wait until the pod's queue has built up (bounded)."""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=self.workers + 2)
        self._http = http = aiohttp.ClientSession(timeout=timeout, connector=connector)
        self._tasks = [asyncio.create_task(self._worker(http)) for _ in range(self.workers)]
        deadline = time.monotonic() + settle_timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                if int((await self._stats(http)).get("waiting", 0)) >= self.spec.waiting - 2:
                    break
            await asyncio.sleep(0.05)
        self._tasks.append(asyncio.create_task(self._sampler(http)))

    def begin(self) -> None:
        """Start the measured window: counts and samples from here on."""
        self._window = _Window()

    async def stop(self) -> dict[str, Any]:
        """Cancel the workers and the sampler; the measured window's numbers."""
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._http is not None:
            await self._http.close()
            self._http = None
        return window_stats(self._window, self.spec, self.workers)


def window_stats(w: _Window, spec: ForeignLoad, workers: int) -> dict[str, Any]:
    def mean(xs: list[int]) -> float:
        return round(statistics.fmean(xs), 2) if xs else 0.0

    return {
        **spec.as_json(),
        "in_flight": workers,
        "sent": w.sent,
        "served": w.served,
        "failed": w.failed,
        "samples": len(w.waiting),
        "mean_waiting": mean(w.waiting),
        "max_waiting": max(w.waiting, default=0),
        "mean_running": mean(w.running),
    }
