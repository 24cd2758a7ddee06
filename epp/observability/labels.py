"""Label values taken from client-chosen strings, kept to a documented bound.

Every distinct label value of the request families costs about 190 series (histograms with their
buckets, the deprecated twins), and prometheus_client never forgets a series. A client choosing
model names or fairness ids must therefore not choose label values. Two policies:

``ModelLabels`` (``model_name``, ``target_model_name``, ``target_model``): a model name is a label
value only when the pool serves it; every other name reads ``unknown``. A name is served when

1. a *source* reports it. The Director registers two: the LoRA adapters the pods' scraped metrics
   list (``Metrics.active_models`` / ``waiting_models``) and the model names of the
   InferenceModelRewrite objects (matched models and targets). Sources are read when a name not yet
   admitted is looked up, at most once every ``refresh`` seconds (1 s); names seen there are
   remembered (at most ``cap`` of them), since a pod lists an adapter only while it runs requests;
2. or a model server confirmed it: a 2xx response to a request whose target model it was
   (``learn``). At most ``learned_cap`` (8) names are learned this way, each at most
   ``max_chars`` (256) characters long, so a model server that answers any name cannot be used to
   grow the set. This is how a base model is found: the pods' metrics carry it only as a label the
   metrics extractor does not keep.

A request's incoming model that differs from its target model (an alias the client asked to be
rewritten) is looked up with ``alias``: only a name a source reports counts there, so a client
cannot pair learned names with each other through the rewrite header.

A served name is admitted as a label value the first time it is looked up and stays admitted (its
series exist from then on anyway). At most ``cap`` (1000) names are admitted; later served names
read ``other``. The empty name stays empty (header-only requests, errors before parsing). Bound:
at most ``cap + 2`` distinct values, of which clients can add at most ``learned_cap``, and those
only through a model server that answers 2xx; the (model, target) pairs clients can make are
``unknown`` or a served name with each target value, and each learned name with itself.

``LabelCap`` (fairness ids, tenant ids chosen by the client): the first ``cap`` distinct values
are kept, later ones read ``other``; with ``max_chars`` a longer value reads ``other`` too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Final

MODEL_LABEL_CAP: Final = 1000
LEARNED_MODEL_CAP: Final = 8
MAX_MODEL_CHARS: Final = 256
FAIRNESS_LABEL_CAP: Final = 64
MAX_FAIRNESS_CHARS: Final = 128
OTHER: Final = "other"
UNKNOWN: Final = "unknown"

log = logging.getLogger(__name__)


class LabelCap:
    """Folds label values beyond ``cap`` distinct ones (or longer than ``max_chars``) into
    ``other`` (thread-safe)."""

    def __init__(self, cap: int = MODEL_LABEL_CAP, *, max_chars: int | None = None) -> None:
        self._cap = cap
        self._max_chars = max_chars
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if self._max_chars is not None and len(value) > self._max_chars:
            return OTHER
        with self._lock:
            if len(self._seen) >= self._cap:
                return OTHER
            self._seen.add(value)
            return value


ModelSource = Callable[[], Iterable[str]]


class ModelLabels:
    """Model name → label value: the name when the pool serves it, else ``unknown``."""

    def __init__(
        self,
        *,
        cap: int = MODEL_LABEL_CAP,
        learned_cap: int = LEARNED_MODEL_CAP,
        max_chars: int = MAX_MODEL_CHARS,
        refresh: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cap = cap
        self._learned_cap = learned_cap
        self._max_chars = max_chars
        self._refresh = refresh
        self._clock = clock
        self._sources: list[ModelSource] = []
        self._admitted: set[str] = set()
        self._learned: set[str] = set()
        self._seen: set[str] = set()  # names the sources reported (at most ``cap``)
        self._current: frozenset[str] = frozenset()  # what the sources report now
        self._next_refresh = 0.0
        self._lock = threading.Lock()

    def add_source(self, source: ModelSource) -> None:
        """``source()`` lists model names the pool serves (called at most once per refresh)."""
        with self._lock:
            self._sources.append(source)
            self._next_refresh = 0.0

    def learn(self, name: str) -> None:
        """A model server answered 2xx to a request for ``name``."""
        if not name or name in self._admitted or name in self._learned:
            return
        if len(name) > self._max_chars or name in self._seen or name in self._current:
            return  # too long, or a source already vouches for it: no learned slot spent
        with self._lock:
            if len(self._learned) < self._learned_cap:
                self._learned.add(name)

    def __call__(self, name: str) -> str:
        if not name or name in self._admitted:
            return name
        if name not in self._learned and not self._served(name):
            return UNKNOWN
        with self._lock:
            if len(self._admitted) >= self._cap:
                return OTHER
            self._admitted.add(name)
            return name

    def alias(self, name: str) -> str:
        """The label of an incoming model that is not the target: only a served name counts."""
        if not name:
            return name
        return self(name) if self._served(name) else UNKNOWN

    def admitted(self) -> frozenset[str]:
        return frozenset(self._admitted)

    def _served(self, name: str) -> bool:
        if name in self._seen or name in self._current:
            return True
        now = self._clock()
        if now < self._next_refresh:
            return False
        self._next_refresh = now + self._refresh
        current: set[str] = set()
        for source in list(self._sources):
            try:
                current.update(source())
            except Exception:  # a source must not break metrics; the old view stays
                log.exception("model-name source failed")
                return False
        self._current = frozenset(current)
        with self._lock:
            for served in current:
                if len(self._seen) >= self._cap:
                    break
                self._seen.add(served)
        return name in self._current
