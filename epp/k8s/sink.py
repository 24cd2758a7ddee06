"""Where InferenceObjective and InferenceModelRewrite objects end up: the request-path stores.

Objects come from two origins, the cluster (watches) and ``--objectives-file`` files. Each origin
replaces its own set; the merged view is pushed into ``ObjectiveStore`` (name → priority) and
``RewriteStore``. Objects whose ``poolRef`` names another pool than this EPP's are dropped (no
pool name, as with file discovery: every object counts; file objects may omit poolRef). An
objective declared in a file overrides a cluster objective of the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from epp.k8s.files import DeclaredObjects
from epp.k8s.meta import PoolRef
from epp.k8s.objectives import Objective, priorities
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.rewrites import ModelRewrite, RewriteStore

RewriteEntry = tuple[PoolRef | None, ModelRewrite]


class ObjectSink:
    def __init__(
        self,
        objectives: ObjectiveStore,
        rewrites: RewriteStore,
        *,
        pool_name: str = "",
        pool_group: str = "",
        logger: logging.Logger | None = None,
    ) -> None:
        self._objective_store = objectives
        self._rewrite_store = rewrites
        self._pool = (pool_name, pool_group)
        self._log = logger or logging.getLogger(__name__)
        self._cluster_objectives: tuple[Objective, ...] = ()
        self._cluster_rewrites: tuple[RewriteEntry, ...] = ()
        self._files = DeclaredObjects()

    def _mine(self, ref: PoolRef | None) -> bool:
        name, group = self._pool
        return not name or ref is None or ref.selects(name, group)

    def set_cluster_objectives(self, objectives: Iterable[Objective]) -> None:
        self._cluster_objectives = tuple(objectives)
        self._apply_objectives()

    def set_cluster_rewrites(self, rewrites: Iterable[RewriteEntry]) -> None:
        self._cluster_rewrites = tuple(rewrites)
        self._apply_rewrites()

    def set_files(self, declared: DeclaredObjects) -> None:
        self._files = declared
        self._apply_objectives()
        self._apply_rewrites()

    def _apply_objectives(self) -> None:
        name, group = self._pool
        merged = priorities(self._cluster_objectives, name, group)
        merged.update(priorities(self._files.objectives, name, group))
        if merged != self._objective_store.snapshot():
            self._objective_store.replace(merged)
            self._log.info("objectives: %d with a priority for this pool", len(merged))

    def _apply_rewrites(self) -> None:
        entries = (*self._cluster_rewrites, *self._files.rewrites)
        self._rewrite_store.replace(rw for ref, rw in entries if self._mine(ref))
        self._log.info("model rewrites: %d objects", len(self._rewrite_store))
