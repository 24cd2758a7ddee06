"""Drives one pod's engine on the asyncio loop: virtual clock, timers, token channels.

The engine only advances when it has work: each state change schedules exactly one
``loop.call_at`` timer for the end of the current step (none when idle), so an idle pod costs
nothing. The virtual clock runs ``time_scale`` times faster than the loop's clock::

    virtual_now = (loop.time() - start) * time_scale

If a timer fires late the engine catches up by running every step that is due, so simulated
throughput does not depend on timer precision (tokens then arrive in bursts).

``/metrics`` (``metrics_page``) answers with the page rendered last until a value on it changes
(engine counts, counters, histogram counts, overrides), so scraping an idle pod every 50 ms
costs the HTTP exchange only; with LoRA adapters every page is rendered, as the LoRA gauge
carries the render's wall time.

A decode pod's sidecar (``epp_tools.sim.disagg``) calls prefill pods over HTTP with the runtime's
own client session (``http()``, created on first use, closed by ``aclose``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from epp_tools.sim.config import PodConfig
from epp_tools.sim.control import Faults, Overrides
from epp_tools.sim.engine import Engine, RemoteKV, TokenEvent
from epp_tools.sim.kvevents import KVEventPublisher
from epp_tools.sim.metrics import MetricsRenderer


@dataclass
class ServeCounters:
    requests_served: int = 0
    requests_failed: int = 0
    injected_errors: int = 0
    dropped_connections: int = 0
    streams_cut: int = 0
    prefill_legs: int = 0
    """P/D prefill legs this pod served (one token and ``kv_transfer_params``)."""
    prefill_failures: int = 0
    """Decode requests whose remote prefill failed (its error went back to the client)."""
    metrics_scrapes: int = 0
    """``/metrics`` requests received (whatever their answer)."""
    stalled_scrapes: int = 0
    """``/metrics`` requests held by ``stall_metrics`` or ``black_hole`` (counted as the hold
    begins)."""


class PodRuntime:
    def __init__(self, config: PodConfig, publisher: KVEventPublisher | None = None) -> None:
        self.config = config
        self.engine = Engine(config)
        self.engine.pool.record_events = publisher is not None  # nobody else reads them
        self.publisher = publisher
        self.metrics = MetricsRenderer(config)
        self.overrides = Overrides()
        self.faults = Faults()
        self.faults_cleared = asyncio.Event()
        self.rng = random.Random(config.seed)
        self.counters = ServeCounters()
        self.responses: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()
        self._channels: dict[str, asyncio.Queue[TokenEvent]] = {}
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None
        self._next_id = 0
        self._http: aiohttp.ClientSession | None = None
        self._page = b""
        self._page_key: tuple[object, ...] | None = None

    def http(self) -> aiohttp.ClientSession:
        """The client session this pod's sidecar calls prefill pods with."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(trust_env=False)
        return self._http

    async def aclose(self) -> None:
        self.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ---- clock ---------------------------------------------------------------------------
    def now(self) -> float:
        return (self._loop.time() - self._start) * self.config.time_scale

    def new_request_id(self, prefix: str) -> str:
        self._next_id += 1
        return f"{prefix}-{self.config.name}-{self._next_id}"

    # ---- requests ------------------------------------------------------------------------
    def submit(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        max_tokens: int | None,
        lora: str | None,
        remote: RemoteKV | None = None,
    ) -> asyncio.Queue[TokenEvent]:
        """Queue a request (``remote``: its prompt KV comes from a prefill pod); raises
        ``RequestRejected`` if it can never run."""
        self.engine.add_request(request_id, prompt_ids, max_tokens, self.now(), lora, remote)
        channel: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._channels[request_id] = channel
        self._pump()
        return channel

    def abort(self, request_id: str) -> None:
        """Release a request the client gave up on (no-op once it finished)."""
        self._channels.pop(request_id, None)
        if self.engine.abort_request(request_id):
            self._pump()

    def reset_prefix_cache(self) -> bool:
        ok = self.engine.reset_prefix_cache()
        self._pump()
        return ok

    # ---- responses API store -------------------------------------------------------------
    def remember_response(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self.responses[response_id] = messages
        while len(self.responses) > self.config.responses_cache_size:
            self.responses.popitem(last=False)

    def recall_response(self, response_id: str) -> list[dict[str, Any]] | None:
        messages = self.responses.get(response_id)
        if messages is not None:
            self.responses.move_to_end(response_id)
        return messages

    # ---- test control --------------------------------------------------------------------
    def set_faults(self, faults: Faults) -> None:
        self.faults = faults
        if not faults.holds_requests:
            self.faults_cleared.set()
            self.faults_cleared = asyncio.Event()

    def metrics_page(self) -> bytes:
        """The ``/metrics`` body, rendered again only when something it shows has changed (an
        idle pod serves the same bytes to every scrape). With LoRA info every page is rendered:
        the current label set carries the wall time of the render, as vLLM's gauge does."""
        renderer = self.metrics
        if renderer.names.lora_info and self.config.lora_enabled:
            return renderer.render(self.engine, self.overrides, time.time()).encode()
        key = _state_key(self.engine, self.overrides)
        if key != self._page_key:
            self._page = renderer.render(self.engine, self.overrides, time.time()).encode()
            self._page_key = key
        return self._page

    def stats_json(self) -> dict[str, Any]:
        e, s, c = self.engine, self.engine.stats, self.counters
        return {
            "pod": self.config.name,
            "role": self.config.role,
            "requests_received": s.requests_received,
            "requests_served": c.requests_served,
            "requests_failed": c.requests_failed,
            "injected_errors": c.injected_errors,
            "dropped_connections": c.dropped_connections,
            "streams_cut": c.streams_cut,
            "metrics_scrapes": c.metrics_scrapes,
            "stalled_scrapes": c.stalled_scrapes,
            "running": e.num_running,
            "waiting": e.num_waiting,
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
            "prefix_query_tokens": s.prefix_queries,
            "prefix_hit_tokens": s.prefix_hits,
            "evictions": e.pool.evictions,
            "preemptions": s.preemptions,
            "prefill_legs": c.prefill_legs,
            "remote_prefills": s.remote_prefills,
            "kv_transfer_blocks": s.kv_transfer_blocks,
            "prefill_failures": c.prefill_failures,
            "transferring": e.num_transferring,
            "kv_used_blocks": e.pool.used_blocks,
            "kv_cached_blocks": e.pool.cached_blocks,
            "kv_events_published": self.publisher.sent if self.publisher else 0,
            "virtual_time_s": self.now(),
        }

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for request_id in list(self._channels):
            self.abort(request_id)

    # ---- engine pump ---------------------------------------------------------------------
    def _pump(self, due: float | None = None) -> None:
        now = self.now()
        if due is not None and due > now:
            now = due  # the timer fired a hair early: its step is due
        for event in self.engine.advance(now):
            channel = self._channels.get(event.request_id)
            if channel is not None:
                channel.put_nowait(event)
                if event.finished:
                    del self._channels[event.request_id]
        events = self.engine.drain_kv_events()
        if events and self.publisher is not None:
            self.publisher.publish(events, time.time())
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        wake = self.engine.next_wakeup()
        if wake is None:
            return
        when = self._start + wake / self.config.time_scale
        self._timer = self._loop.call_at(when, self._pump, wake)


def _state_key(engine: Engine, overrides: Overrides) -> tuple[object, ...]:
    """Every value a ``/metrics`` page without LoRA info shows, in one comparable tuple; the
    counters and histograms only grow, so their totals and counts tell any change."""
    stats = engine.stats
    return (
        engine.num_running,
        engine.num_waiting,
        engine.num_transferring,
        engine.kv_usage,
        stats.prompt_tokens,
        stats.generation_tokens,
        stats.prefix_queries,
        stats.prefix_hits,
        stats.preemptions,
        tuple(stats.finished.values()),
        stats.ttft.count,
        stats.itl.count,
        stats.e2e.count,
        overrides,
    )
