"""An in-memory ``ReplicaSyncer`` (one shared log, switchable down) and a ``SharedState`` plugin
that records what it is asked, for the sync-loop tests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.plugin import Delivery, TypedName


@dataclass
class MemoryLog:
    entries: list[Delivery] = field(default_factory=list)
    down: bool = False

    def check(self) -> None:
        if self.down:
            raise ConnectionError("log unavailable")


class MemorySyncer:
    def __init__(self, log: MemoryLog, replica_id: str, *, bootstrap_timeout: float = 1.0) -> None:
        self.typed_name = TypedName("memory-syncer", "memory")
        self.log = log
        self._replica_id = replica_id
        self._bootstrap_timeout = bootstrap_timeout
        self.cursor: int | None = None
        self.pool = ""
        self.published: list[dict[str, list[Any]]] = []
        self.published_at: list[float] = []  # loop time of each publish
        self.on_publish = asyncio.Event()

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def bootstrap_timeout(self) -> float:
        return self._bootstrap_timeout

    def bind(self, pool: str) -> None:
        self.pool = pool

    async def publish(self, batch: Mapping[str, Sequence[Any]]) -> None:
        self.log.check()
        copy = {k: list(v) for k, v in batch.items()}
        self.published.append(copy)
        self.published_at.append(asyncio.get_running_loop().time())
        self.on_publish.set()
        self.log.entries.append(Delivery(self._replica_id, copy))

    async def receive(self, wait: float = 0.0) -> list[Delivery]:
        """Never waits (a transport may return empty before ``wait`` is over)."""
        self.log.check()
        if self.cursor is None:
            self.cursor = len(self.log.entries)
            return []
        out = self.log.entries[self.cursor :]
        self.cursor = len(self.log.entries)
        return out

    async def replay(self) -> list[Delivery]:
        self.log.check()
        self.cursor = len(self.log.entries)
        return list(self.log.entries[-100:])


class Notes:
    """A ``SharedState`` plugin: ``learn`` queues facts, ``applied`` records (facts, origin)."""

    def __init__(self, name: str = "notes", *, fail_export: bool = False) -> None:
        self.typed_name = TypedName("notes-plugin", name)
        self.learned: list[Any] = []
        self.applied: list[tuple[list[Any], str]] = []
        self.fail_export = fail_export
        self.fail_apply = False

    def learn(self, *facts: Any) -> None:
        self.learned.extend(facts)

    def export_facts(self) -> list[Any]:
        if self.fail_export:
            raise RuntimeError("export broke")
        out, self.learned = self.learned, []
        return out

    def apply_facts(self, facts: Sequence[Any], origin: str) -> None:
        if self.fail_apply:
            raise ValueError("apply broke")
        self.applied.append((list(facts), origin))

    def facts_from(self, origin: str) -> list[Any]:
        return [f for facts, o in self.applied if o == origin for f in facts]
