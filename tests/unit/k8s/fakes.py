"""Test doubles of the Kubernetes layer's two seams, shared by the unit tests of epp.k8s."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.k8s.leader import Conflict

Step = Any
"""A list step is ``(items, resourceVersion)`` or an exception; a watch step is a list of
events, optionally ending with an exception to raise after them."""


def obj(name: str, rv: str, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": rv}, **fields}


def event(kind: str, name: str, rv: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "object": obj(name, rv, **fields)}


@dataclass
class ScriptedTarget:
    """A ``WatchTarget`` replaying scripted list and watch results, recording the calls."""

    lists: list[Step]
    watches: list[Sequence[Any]]
    name: str = "fake"
    calls: list[tuple[str, str]] = field(default_factory=list)
    stopped: bool = False

    def list(self) -> tuple[list[Any], str]:
        self.calls.append(("list", ""))
        step = self.lists.pop(0)
        if isinstance(step, Exception):
            raise step
        items, rv = step
        return list(items), rv

    def watch(self, resource_version: str, timeout_seconds: int) -> Iterator[Mapping[str, Any]]:
        self.calls.append(("watch", resource_version))
        for step in self.watches.pop(0) if self.watches else []:
            if isinstance(step, Exception):
                raise step
            yield step

    def stop(self) -> None:
        self.stopped = True


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class MemoryLeases:
    """A ``LeaseClient`` with the API server's optimistic concurrency (resourceVersion)."""

    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: int = 0
    fail_next: Exception | None = None

    def _check(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    def get(self, name: str) -> dict[str, Any] | None:
        self._check()
        lease = self.leases.get(name)
        return copy.deepcopy(lease) if lease else None

    def create(self, lease: dict[str, Any]) -> dict[str, Any]:
        self._check()
        name = lease["metadata"]["name"]
        if name in self.leases:
            raise Conflict("already exists")
        return self._store(name, lease)

    def replace(self, lease: dict[str, Any]) -> dict[str, Any]:
        self._check()
        name = lease["metadata"]["name"]
        current = self.leases[name]
        if lease["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise Conflict("the object has been modified")
        return self._store(name, lease)

    def _store(self, name: str, lease: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        stored = copy.deepcopy(lease)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        self.leases[name] = stored
        return copy.deepcopy(stored)

    def spec(self, name: str) -> dict[str, Any]:
        return dict(self.leases[name]["spec"])
