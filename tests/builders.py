"""Small builders for plugin unit tests: endpoints, requests, cycle states and a plugin handle.

Every value is deterministic: endpoint ``i`` is ``default/pod-<i>-rank-0`` at ``192.168.1.<i+1>``,
metrics are stamped at ``NOW`` unless told otherwise, and cycles are seeded.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from epp.plugin import CycleState, Endpoint, InferenceRequest, Metrics, TypedName

NOW = 1000.0
"""The clock reading every builder uses by default (seconds)."""


def make_endpoint(
    i: int,
    *,
    queue: int = 0,
    kv: float = 0.0,
    running: int = 0,
    active: Iterable[str] = (),
    waiting: Iterable[str] = (),
    max_lora: int = 0,
    labels: Mapping[str, str] | None = None,
    address: str | None = None,
    port: int = 8000,
    update_time: float = NOW,
) -> Endpoint:
    """Endpoint ``i`` with fresh metrics; use ``dataclasses.replace(ep, metrics=None)`` for none."""
    metrics = Metrics(
        waiting_queue_size=queue,
        running_requests_size=running,
        kv_cache_usage_percent=kv,
        active_models=frozenset(active),
        waiting_models=frozenset(waiting),
        max_active_models=max_lora,
        update_time=update_time,
    )
    return Endpoint(
        id=f"default/pod-{i}-rank-0",
        name=f"pod-{i}",
        namespace="default",
        address=address if address is not None else f"192.168.1.{i + 1}",
        port=port,
        labels=dict(labels or {}),
        metrics=metrics,
    )


def make_request(**kw: Any) -> InferenceRequest:
    """A request with id ``req-0`` and no headers unless overridden; other fields pass through."""
    kw.setdefault("request_id", "req-0")
    kw.setdefault("headers", {})
    return InferenceRequest(**kw)


def make_cycle(seed: int = 0, now: float = NOW) -> CycleState:
    return CycleState(now=now, rng=random.Random(seed))


@dataclass
class FakeHandle:
    """Satisfies ``epp.plugin.Handle`` with no other plugins and no endpoints; ``create_plugin``
    builds real plugins by type name."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    now: float = NOW
    shared_soon: int = 0
    """How many times a plugin called ``share_soon``."""

    def clock(self) -> float:
        return self.now

    def share_soon(self) -> None:
        self.shared_soon += 1

    def plugin(self, name: str) -> Any:
        raise KeyError(name)

    def endpoints(self) -> Sequence[Endpoint]:
        return ()

    def logger(self, typed_name: TypedName) -> logging.Logger:
        return logging.getLogger(str(typed_name))

    def create_plugin(
        self, type_name: str, name: str, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        """Built by the loader's factory from the installed plugins, alpha types allowed."""
        from epp.config.loader import PluginFactory
        from epp.plugin.registry import PluginRegistry

        factory = PluginFactory(PluginRegistry.from_entry_points(), allow_experimental=True)
        return factory.create(type_name, name, parameters, self)


def handle() -> FakeHandle:
    return FakeHandle()


def chained_adds(
    rng: random.Random, count: int, endpoints: Sequence[str], longest: int = 30
) -> list[tuple[str, list[int]]]:
    """``count`` (endpoint, chain) pairs shaped like agents' traffic and chained as
    ``block_hashes`` chains them (a block's id names its whole prefix): fresh conversations, next
    turns, forks from a point of a conversation, shorter repeats; a conversation past
    ``longest`` blocks starts afresh, as a compaction does."""
    ids: dict[tuple[int, ...], int] = {}
    conversations: list[list[int]] = []
    adds = []
    for _ in range(count):
        roll = rng.random()
        if not conversations or roll < 0.15:
            tokens = [rng.randrange(10**6)]
            conversations.append(tokens)
        else:
            i = rng.randrange(len(conversations))
            base = conversations[i]
            cut = rng.randrange(1, len(base) + 1)
            new = [rng.randrange(3) for _ in range(rng.randrange(4))]
            if roll < 0.6:
                tokens = base + new if len(base) + len(new) <= longest else [rng.randrange(10**6)]
                conversations[i] = tokens
            elif roll < 0.8:
                tokens = base[:cut] + new
                conversations.append(tokens)
            else:
                tokens = base[:cut]
        chain = [ids.setdefault(tuple(tokens[: n + 1]), len(ids)) for n in range(len(tokens))]
        adds.append((rng.choice(list(endpoints)), chain))
    return adds
