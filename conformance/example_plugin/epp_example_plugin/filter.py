"""``example-max-queue-filter``: keep endpoints whose waiting queue is at most ``maxWaiting``.

An endpoint never scraped is kept (nothing is known against it). When no endpoint passes, all of
them are kept: the filter sheds load, it never leaves a request without a candidate.

Parameters: ``maxWaiting`` (default 8).

YAML::

    plugins:
    - type: example-max-queue-filter
      parameters: {maxWaiting: 4}
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase


class MaxQueueFilter(PluginBase):
    TYPE: ClassVar[str] = "example-max-queue-filter"

    @dataclass(frozen=True)
    class Params:
        max_waiting: int = 8

        def __post_init__(self) -> None:
            if self.max_waiting < 0:
                raise ValueError("maxWaiting must be >= 0")

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        limit = self.params.max_waiting
        kept = [e for e in endpoints if e.metrics is None or e.metrics.waiting_queue_size <= limit]
        return kept or list(endpoints)
