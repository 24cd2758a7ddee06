"""InferenceObjective lookup: objective name (from the request header) → priority.

Unknown or unset objectives have priority 0 (upstream behaviour, spec §14.13). The store is filled
by whatever owns objectives: the Kubernetes reconciler or a file of objects.
"""

from __future__ import annotations

from collections.abc import Mapping


class ObjectiveStore:
    def __init__(self, priorities: Mapping[str, int] | None = None) -> None:
        self._priorities: dict[str, int] = dict(priorities or {})

    def priority(self, objective: str) -> int:
        if not objective:
            return 0
        return self._priorities.get(objective, 0)

    def replace(self, priorities: Mapping[str, int]) -> None:
        self._priorities = dict(priorities)

    def snapshot(self) -> dict[str, int]:
        return dict(self._priorities)
