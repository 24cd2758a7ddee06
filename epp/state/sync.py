"""``StateSync``: moves routing facts between EPP replicas (active-active serving).

Started only when the config names a cross-replica syncer
(``dataLayer.crossReplicaSyncerPluginRef``) and at least one plugin implements ``SharedState``.
``run`` is two long-lived tasks of the App, so that neither side waits for the other:

- **Publish.** Collect ``export_facts()`` of every ``SharedState`` plugin (detected once at load;
  the flow controller takes part as ``flow-control``) into one batch (plugin name → facts) in the
  outbox, and publish the outbox through the ``ReplicaSyncer``, oldest first, merged into entries
  of at most ``publish_facts`` facts (at most 4 entries a round). A round runs every
  ``crossReplicaSyncInterval`` (default 200 ms; below 10 ms it is raised to 10 ms) and, sooner,
  once a plugin called ``share_soon()`` (``Handle.share_soon``), but never within
  ``soon_gap`` (5 ms) of the previous round, nor within ten times what that round took, up to
  four ``soon_gap`` (a round that waited 2 ms for a busy event loop is followed by a 20 ms gap;
  never more than the interval): a share_soon after a quiet spell publishes at once, and under
  load one publish carries the facts of every request of the last gap. Each publish wakes every
  replica's receive, so publishing per request would cost a round of Redis calls per request on
  every replica; the gap grows with load where that matters. The outbox is bounded
  (``outbox_facts``, default 8,192 facts): when the syncer is down the newest batches are kept
  and the oldest dropped and counted (``llm_d_epp_state_sync_dropped_facts_total``).
- **Receive.** Replay the log (bootstrap, below), then receive in a loop, each call waiting up to
  one interval for new batches (``ReplicaSyncer.receive(wait)``; ``redis-syncer`` blocks in
  ``XREAD``), so a peer's facts are applied a round trip after it published them. Batches are
  applied by plugin name: this replica's own and names no plugin here has are skipped and
  counted, and the CPU time spent applying them is counted by plugin
  (``llm_d_epp_state_sync_apply_seconds_total``: what sharing costs this replica beside its own
  requests, since every replica applies every other one's facts). Between batches the loop
  yields to the event loop, so a large catch-up never stalls request handling. A syncer that
  returns empty before the wait is over is called again only when the interval has passed, so
  the loop never spins.

``round`` is the two sides once, in order (collect, bootstrap if due, publish, receive without
waiting), for tests and tools.

**Bootstrap.** The receive side first replays the log's tail (``ReplicaSyncer.replay``) and
applies it; ``ready()`` is false until then, and ``App.ready()`` includes it, so a replica that
starts (or restarts under load) reports SERVING only with what its peers learned. If the syncer
is unreachable, ``ready()`` turns true anyway once ``bootstrap_timeout`` (the syncer's,
``bootstrapTimeout`` of ``redis-syncer``: 5 s) has passed since the loop started: a Redis outage
must never keep the EPP unready. The loop keeps retrying the replay and applies the tail as soon
as it succeeds. The warm standby of leader election runs the loop too (every App does), so a new
leader starts warm.

**Outage.** Requests never wait for the syncer: they read local state, which the loop updates
between them, and ``share_soon`` only sets a flag. A failed operation is counted
(``llm_d_epp_state_sync_errors_total{operation}``), logged (the first time, then at most every
30 s, and on recovery) and retried by its side with a backoff doubling from the interval up to
1 s; ``share_soon`` does not cut a backoff short. The staleness of the view shows as
``llm_d_epp_state_sync_lag_seconds`` (time since the last successful receive). When the syncer
answers again the outbox is published and the receive resumes from the cursor: facts published
during the outage are caught up, within the log's bound. An exception from a plugin's
``export_facts`` or ``apply_facts`` is counted and logged; it never stops the loop. Cancelling
``run`` (the App stopping) ends both sides at once, a waiting receive included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter as Tally
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry

from epp.plugin import Delivery, ReplicaSyncer, SharedState
from epp.state.metrics import SyncMetrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL: Final = 0.2
"""Seconds between rounds when ``crossReplicaSyncInterval`` is absent (upstream's default)."""
MIN_INTERVAL: Final = 0.01
SOON_GAP: Final = 0.005
"""Least seconds between two publish rounds, however often ``share_soon`` is called."""
GAP_FACTOR: Final = 10
"""After a publish round, the next waits at least this many times as long as the round took ..."""
MAX_GAP_FACTOR: Final = 4
"""... but at most this many ``soon_gap`` (20 ms): a binding must still beat its follow-up."""
OUTBOX_FACTS: Final = 8192
PUBLISH_FACTS: Final = 2048
PUBLISHES_PER_ROUND: Final = 4
MAX_BACKOFF: Final = 1.0
LOG_EVERY: Final = 30.0

Batch = dict[str, list[Any]]


def pool_scope(namespace: str, pool_name: str) -> str:
    """The identity a syncer keeps pools apart by: ``<namespace>/<pool>`` (``default`` for
    either when unset, e.g. with file discovery)."""
    return f"{namespace or 'default'}/{pool_name or 'default'}"


class StateSync:
    """The sync loop of one App (see the module docstring). ``round`` is one step; ``run`` loops."""

    def __init__(
        self,
        syncer: ReplicaSyncer,
        plugins: Sequence[SharedState],
        *,
        interval: float,
        metrics: SyncMetrics,
        clock: Callable[[], float] = time.monotonic,
        outbox_facts: int = OUTBOX_FACTS,
        publish_facts: int = PUBLISH_FACTS,
        soon_gap: float = SOON_GAP,
    ) -> None:
        self.syncer = syncer
        self.plugins = {p.typed_name.name: p for p in plugins}
        if len(self.plugins) < len(plugins):
            log.warning("several shared-state plugins have one name; only the last one syncs")
        self.interval = max(interval, MIN_INTERVAL)
        self.soon_gap = min(max(soon_gap, 0.0), self.interval)
        self.metrics = metrics
        self._clock = clock
        self._outbox_cap = outbox_facts
        self._publish_cap = publish_facts
        self._outbox: deque[tuple[Batch, int]] = deque()
        self._outbox_size = 0
        self._bootstrapped = False
        self._deadline: float | None = None
        self._last_sync: float | None = None
        self._failures: dict[str, int] = {}  # by side (publish, receive, round): failed in a row
        self._soon = asyncio.Event()
        self._received = 0  # batches the last receive returned
        self._logged_at: dict[str, float] = {}
        metrics.lag.set_function(self.lag)
        metrics.outbox_facts.set_function(lambda: self._outbox_size)

    @classmethod
    def create(
        cls,
        syncer: ReplicaSyncer | None,
        plugins: Sequence[SharedState],
        *,
        interval: float,
        registry: CollectorRegistry,
        namespace: str = "",
        pool_name: str = "",
    ) -> StateSync | None:
        """The sync loop of an App, or ``None`` without a syncer or anything to share."""
        if syncer is None:
            return None
        if not plugins:
            log.info("%s: no plugin shares state; cross-replica sync is off", syncer.typed_name)
            return None
        syncer.bind(pool_scope(namespace, pool_name))
        names = ", ".join(str(p.typed_name) for p in plugins)
        log.info(
            "cross-replica sync through %s as replica %s every %.3fs: %s",
            syncer.typed_name,
            syncer.replica_id,
            interval,
            names,
        )
        sync = cls(syncer, plugins, interval=interval, metrics=SyncMetrics(registry))
        sync.collect()  # a first export_facts: the plugins queue facts for export from now on
        return sync

    # ---- state --------------------------------------------------------------------------------

    @property
    def bootstrapped(self) -> bool:
        """Whether the log's tail was replayed and applied."""
        return self._bootstrapped

    @property
    def outbox_size(self) -> int:
        return self._outbox_size

    def lag(self) -> float:
        """Seconds since the other replicas' facts were last read (0 before the loop starts)."""
        return 0.0 if self._last_sync is None else max(0.0, self._clock() - self._last_sync)

    def ready(self) -> bool:
        """Bootstrapped, or the bootstrap wait is over (the loop has run ``bootstrap_timeout``)."""
        if self._bootstrapped:
            return True
        return self._deadline is not None and self._clock() >= self._deadline

    # ---- the loop -----------------------------------------------------------------------------

    def begin(self) -> None:
        """Start the bootstrap wait (``run`` does it; tests driving ``round`` call it)."""
        now = self._clock()
        self._deadline = now + self.syncer.bootstrap_timeout
        self._last_sync = now

    def share_soon(self) -> None:
        """Publish within ``soon_gap`` rather than at the next interval (``Handle.share_soon``)."""
        if not self._soon.is_set():
            self._soon.set()

    async def run(self) -> None:
        """The publish and receive sides, until cancelled."""
        self.begin()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._publisher())
            tg.create_task(self._receiver())

    async def round(self) -> bool:
        """One round (collect, bootstrap if due, publish, receive); whether the syncer answered."""
        self.collect()
        ok = (
            (self._bootstrapped or await self._attempt("replay", self._bootstrap()))
            and await self._attempt("publish", self._flush())
            and await self._attempt("receive", self._receive(0.0))
        )
        self._settle("round", ok)
        return ok

    async def _publisher(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._soon.clear()  # a share_soon from now on asks for the next round
            self.collect()
            started = loop.time()
            ok = await self._attempt("publish", self._flush())
            delay = self._settle("publish", ok)
            # the debounce: at least soon_gap, longer when a round takes long (a busy loop)
            took = GAP_FACTOR * (loop.time() - started)
            gap = min(delay, max(self.soon_gap, min(took, self.soon_gap * MAX_GAP_FACTOR)))
            await asyncio.sleep(gap)
            if not ok:
                await asyncio.sleep(delay - gap)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay - gap):
                    await self._soon.wait()

    async def _receiver(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started, received = loop.time(), 0
            if not self._bootstrapped:
                ok = await self._attempt("replay", self._bootstrap())
                received = 1  # go on to receive at once
            else:
                ok = await self._attempt("receive", self._receive(self.interval))
                received = self._received
            delay = self._settle("receive", ok)
            if not ok:
                await asyncio.sleep(delay)
            elif not received:  # returned empty before the wait was over: never spin
                await asyncio.sleep(max(0.0, started + self.interval - loop.time()))

    def _settle(self, side: str, ok: bool) -> float:
        """Record a side's outcome; the seconds it waits before trying again."""
        failures = self._failures.get(side, 0)
        if ok:
            if failures:
                log.info("cross-replica sync (%s) is back after %d failures", side, failures)
                self._failures[side] = 0
            return self.interval
        self._failures[side] = failures = failures + 1
        backoff = self.interval * 2.0 ** min(failures, 16)
        return max(self.interval, min(backoff, MAX_BACKOFF))

    def collect(self) -> None:
        """Move every plugin's new facts into the outbox (bounded: the oldest are dropped)."""
        batch: Batch = {}
        for name, plugin in self.plugins.items():
            try:
                facts = plugin.export_facts()
            except Exception as exc:
                self.metrics.errors.labels("export").inc()
                self._warn("export_facts of %s raised: %r", plugin.typed_name, exc)
                continue
            if facts:
                batch[name] = list(facts)
        if not batch:
            return
        size = sum(len(f) for f in batch.values())
        self._outbox.append((batch, size))
        self._outbox_size += size
        while self._outbox_size > self._outbox_cap and len(self._outbox) > 1:
            dropped, n = self._outbox.popleft()
            self._outbox_size -= n
            for name, facts in dropped.items():
                self.metrics.dropped_facts.labels(name).inc(len(facts))

    # ---- steps --------------------------------------------------------------------------------

    async def _attempt(self, operation: str, step: Awaitable[None]) -> bool:
        try:
            await step
        except Exception as exc:
            self.metrics.errors.labels(operation).inc()
            self._warn(
                "cross-replica sync: %s failed (%s); routing continues on local state",
                operation,
                f"{type(exc).__name__}: {exc}",
            )
            return False
        return True

    async def _bootstrap(self) -> None:
        started = self._clock()
        deliveries = await self.syncer.replay()
        self.metrics.batches.labels("replayed").inc(len(deliveries))
        applied = await self._apply(deliveries)
        self._bootstrapped = True
        self._last_sync = self._clock()
        self.metrics.bootstrapped.set(1)
        log.info(
            "cross-replica sync: replayed %d batches (%d facts applied) in %.3fs",
            len(deliveries),
            applied,
            self._last_sync - started,
        )

    async def _flush(self) -> None:
        for _ in range(PUBLISHES_PER_ROUND):
            if not self._outbox:
                return
            merged: Batch = {}
            taken = size = 0
            for batch, n in self._outbox:
                if taken and size + n > self._publish_cap:
                    break
                for name, facts in batch.items():
                    merged.setdefault(name, []).extend(facts)
                taken += 1
                size += n
            await self.syncer.publish(merged)
            for _ in range(taken):
                self._outbox.popleft()
            self._outbox_size -= size
            self.metrics.batches.labels("published").inc()
            for name, facts in merged.items():
                self.metrics.published_facts.labels(name).inc(len(facts))

    async def _receive(self, wait: float) -> None:
        self._received = 0
        deliveries = await self.syncer.receive(wait)
        self._received = len(deliveries)
        self._last_sync = self._clock()
        self.metrics.batches.labels("received").inc(len(deliveries))
        await self._apply(deliveries)

    async def _apply(self, deliveries: Sequence[Delivery]) -> int:
        """Apply each batch by plugin name; returns the number of facts applied."""
        own = self.syncer.replica_id
        skipped: Tally[str] = Tally()
        applied = 0
        for i, (origin, batch) in enumerate(deliveries):
            if i:
                await asyncio.sleep(0)  # a long catch-up must not stall requests
            for name, facts in batch.items():
                plugin = self.plugins.get(name)
                if origin == own or plugin is None:
                    skipped["own_origin" if origin == own else "unknown_plugin"] += len(facts)
                    continue
                started = time.thread_time()  # CPU, not wall: a busy machine preempts it
                try:
                    plugin.apply_facts(facts, origin)
                except Exception as exc:
                    self.metrics.errors.labels("apply").inc()
                    self._warn("apply_facts of %s raised: %r", plugin.typed_name, exc)
                    continue
                finally:  # what sharing costs this replica, next to its own requests
                    self.metrics.apply_seconds.labels(name).inc(time.thread_time() - started)
                applied += len(facts)
                self.metrics.applied_facts.labels(name).inc(len(facts))
        for reason, n in skipped.items():
            self.metrics.skipped_facts.labels(reason).inc(n)
        return applied

    def _warn(self, message: str, *args: Any) -> None:
        """Log each kind of message at most every 30 s (the counters have every occurrence)."""
        now = self._clock()
        last = self._logged_at.get(message)
        if last is None or now - last >= LOG_EVERY:
            self._logged_at[message] = now
            log.warning(message, *args)
