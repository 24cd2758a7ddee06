"""Ordering policies: which request of one flow is dispatched first (smallest key first).

``fcfs-ordering-policy`` (default)::

    key = (enqueue_time, seq)

First come, first served by the logical enqueue time (the controller's clock at enqueue);
``seq`` (arrival order) breaks ties.

``edf-ordering-policy`` (earliest deadline first)::

    deadline = enqueue_time + ttl        # ttl = the request's queue-wait budget
    deadline = +inf                      # when ttl <= 0 (no budget: never urgent)
    key = (deadline, enqueue_time, seq)

``slo-deadline-ordering-policy``::

    deadline = received_at + x-llm-d-slo-ttft-ms / 1000
    deadline = +inf     # header missing, empty, not a non-negative integer, or absurdly large
    key = (deadline, received_at, seq)

The TTFT header is read from the request (alias ``x-slo-ttft-ms``); requests without a valid
SLO go after every request that has one, in arrival order.

None of the three takes parameters. YAML::

    plugins:
      - type: edf-ordering-policy
    flowControl:
      priorityBands:
        - priority: 10
          orderingPolicyRef: edf-ordering-policy
"""

from __future__ import annotations

import math
import re
from typing import ClassVar, Final

from epp.plugin import PluginBase
from epp.plugin.flow import QueuedRequest

SLO_TTFT_HEADERS: Final = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
# Go's time.Duration overflows past this many milliseconds; upstream treats larger values as
# invalid, and so do we.
_MAX_SLO_MS: Final = (2**63 - 1) // 1_000_000
_DECIMAL: Final = re.compile(r"\+?[0-9]+")


class FCFSOrderingPolicy(PluginBase):
    TYPE: ClassVar[str] = "fcfs-ordering-policy"

    def order_key(self, item: QueuedRequest) -> tuple[float, ...]:
        return (item.enqueue_time, float(item.seq))


class EDFOrderingPolicy(PluginBase):
    TYPE: ClassVar[str] = "edf-ordering-policy"

    def order_key(self, item: QueuedRequest) -> tuple[float, ...]:
        deadline = item.enqueue_time + item.ttl if item.ttl > 0 else math.inf
        return (deadline, item.enqueue_time, float(item.seq))


class SLODeadlineOrderingPolicy(PluginBase):
    TYPE: ClassVar[str] = "slo-deadline-ordering-policy"

    def order_key(self, item: QueuedRequest) -> tuple[float, ...]:
        received = item.request.received_at
        return (slo_deadline(item), received, float(item.seq))


def slo_deadline(item: QueuedRequest) -> float:
    """``received_at + TTFT SLO``, or ``+inf`` when the request carries no valid SLO header."""
    headers = item.request.headers
    raw = ""
    for name in SLO_TTFT_HEADERS:
        raw = headers.get(name, "").strip()
        if raw:
            break
    if _DECIMAL.fullmatch(raw) is None:
        return math.inf
    ms = int(raw)
    if ms > _MAX_SLO_MS:
        return math.inf
    return item.request.received_at + ms / 1000.0
