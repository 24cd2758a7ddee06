"""What ``precise-prefix-cache-producer`` knows of the pool: the endpoints as notifications tell
them, the map from a central-socket topic's pod field to an endpoint, and which subscribed
publishers have been silent.

Notifications. ``Membership`` keeps the endpoints ``endpoint-notification-source`` announced
(``None`` until the first event: the producer then polls the pool) and calls ``apply`` once per
burst of events (on the next loop iteration), so an initial pool of N endpoints costs one
subscription update, not N.

Silence. ZMQ does not report a publisher that is not there (a SUB socket keeps reconnecting
quietly), so the producer watches what arrives instead: a publisher it subscribed to that has
sent nothing ``SILENT_AFTER`` seconds later, or a bound central socket when nothing at all has
arrived that long, is reported (a warning at most every ``SILENT_LOG_INTERVAL`` seconds, naming
up to five endpoints) and counted in ``llm_d_epp_precise_prefix_silent_publishers``. Routing is
unaffected: those endpoints simply match no prefix, as upstream's producer degrades. An idle
engine publishes nothing either, so the message says so.
``llm_d_epp_kv_cache_events_active_subscribers`` counts the per-endpoint subscriptions (intent,
as upstream's gauge). Both gauges are labelled ``plugin_name``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, Gauge

from epp.plugin import Endpoint, EndpointEvent, EndpointEventType
from epp.plugin.metrics import metric_family

SILENT_AFTER: Final = 30.0
SILENT_LOG_INTERVAL: Final = 300.0
_NAMED: Final = 5


class Membership:
    """The pool as endpoint notifications describe it."""

    def __init__(self, apply: Callable[[], None], log: logging.Logger) -> None:
        self._apply = apply
        self._log = log
        self.members: dict[str, Endpoint] | None = None
        """``None`` until the first notification."""
        self._pending = False

    def follow(self, event: EndpointEvent) -> None:
        if self.members is None:
            self.members = {}
            self._log.info("following the pool through endpoint notifications")
        endpoint = event.endpoint
        if event.type is EndpointEventType.DELETE:
            self.members.pop(endpoint.id, None)
        else:
            self.members[endpoint.id] = endpoint
        if self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a direct call): apply now
            self._run()
            return
        self._pending = True
        loop.call_soon(self._run)

    def _run(self) -> None:
        self._pending = False
        try:
            self._apply()
        except Exception:
            self._log.exception("applying endpoint notifications failed")


class PodMap:
    """Topic pod field (endpoint id, pod name, ``address:port``, or address with a rank) →
    endpoint id, for events on the central socket."""

    def __init__(self) -> None:
        self._pods: dict[str, str] = {}
        self._ranks: dict[str, dict[int, str]] = {}
        self.built_at = float("-inf")

    def build(self, endpoints: Sequence[Endpoint], now: float) -> None:
        pods: dict[str, str] = {}
        ranks: dict[str, dict[int, str]] = {}
        for ep in endpoints:
            pods[ep.id] = ep.id
            pods.setdefault(ep.name, ep.id)
            pods[ep.hostport] = ep.id
            ranks.setdefault(ep.address, {})[ep.rank] = ep.id
        self._pods, self._ranks = pods, ranks
        self.built_at = now

    def lookup(self, pod: str, rank: int | None) -> str | None:
        found = self._pods.get(pod)
        if found is not None:
            return found
        ranks = self._ranks.get(pod)
        if not ranks:
            return None
        if rank is not None and rank in ranks:
            return ranks[rank]
        return ranks.get(0) if len(ranks) > 1 else next(iter(ranks.values()))


class PublisherWatch:
    """Subscribed publishers (and the central socket) that have sent nothing yet."""

    def __init__(self, registry: CollectorRegistry, name: str, log: logging.Logger) -> None:
        self._log = log
        self._since: dict[str, float] = {}
        self._heard: set[str] = set()
        self._central_since: float | None = None
        self._logged_at = float("-inf")
        self._reported: set[str] = set()
        labels = ("plugin_name",)
        self._active = metric_family(
            registry,
            Gauge,
            "llm_d_epp_kv_cache_events_active_subscribers",
            "KV-event subscriptions to endpoints, including those not receiving anything.",
            labels,
        ).labels(name)
        self._silent = metric_family(
            registry,
            Gauge,
            "llm_d_epp_precise_prefix_silent_publishers",
            "Subscribed KV-event publishers (or the central socket) that sent nothing since "
            f"subscribing at least {SILENT_AFTER:.0f}s ago.",
            labels,
        ).labels(name)
        self.silent: tuple[str, ...] = ()

    def heard(self, endpoint: str) -> None:
        if endpoint in self._since:
            self._heard.add(endpoint)

    def central_bound(self, now: float) -> None:
        self._central_since = now

    def check(
        self, targets: Mapping[str, str], now: float, *, nothing_received: bool = False
    ) -> tuple[str, ...]:
        """Follow ``targets`` (endpoint id → URL); returns the silent ones (``central`` for the
        bound socket when ``nothing_received``), updates the gauges and logs newly silent ones."""
        for ep in [e for e in self._since if e not in targets]:
            del self._since[ep]
            self._heard.discard(ep)
            self._reported.discard(ep)
        for ep in targets:
            self._since.setdefault(ep, now)
        silent = [
            ep
            for ep, since in self._since.items()
            if ep not in self._heard and now - since >= SILENT_AFTER
        ]
        central = self._central_since
        if central is not None and nothing_received and now - central >= SILENT_AFTER:
            silent.append("central")
        self.silent = tuple(sorted(silent))
        self._active.set(len(targets))
        self._silent.set(len(silent))
        fresh = [ep for ep in self.silent if ep not in self._reported]
        if fresh and now - self._logged_at >= SILENT_LOG_INTERVAL:
            self._logged_at = now
            self._reported.update(fresh)
            named = ", ".join(f"{ep} ({targets.get(ep, 'bound socket')})" for ep in fresh[:_NAMED])
            more = f" and {len(fresh) - _NAMED} more" if len(fresh) > _NAMED else ""
            self._log.warning(
                "no KV events from %s%s in %.0fs since subscribing: their prefix matches stay 0 "
                "(an idle engine publishes nothing; otherwise check its --kv-events-config)",
                named,
                more,
                SILENT_AFTER,
            )
        return self.silent
