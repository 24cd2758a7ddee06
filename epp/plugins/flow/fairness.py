"""Fairness policies: which flow of a priority band dispatches next.

``global-strict-fairness-policy`` (default): no fairness between flows. The flow whose head has
the smallest ordering key in the whole band wins, so the band behaves like one queue ordered by
its ordering policy (with FCFS: strict arrival order across all fairness ids).

``round-robin-fairness-policy``: a cursor per band over the flow ids in sorted order. The next
flow is the first non-empty one whose id sorts after the last dispatched flow's id, wrapping
around; a flow that disappears does not reset the cycle.

``program-aware-fairness``: least attained service (LAS) per program (= fairness id); see
``epp.plugins.flow.program_aware``.

The first two take no parameters. YAML::

    plugins:
      - type: round-robin-fairness-policy
    flowControl:
      defaultPriorityBand:
        fairnessPolicyRef: round-robin-fairness-policy
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import PluginBase
from epp.plugin.flow import BandView, FlowView, QueuedRequest


class _NoAccounting:
    """Fairness policies that keep no per-flow history ignore the lifecycle hooks."""

    def new_state(self) -> Any:
        return None

    def on_dispatch(self, band: BandView, flow: FlowView, item: QueuedRequest, now: float) -> None:
        return None

    def on_complete(
        self, fairness_id: str, input_tokens: int, output_tokens: int, now: float
    ) -> None:
        return None


class GlobalStrictFairnessPolicy(_NoAccounting, PluginBase):
    TYPE: ClassVar[str] = "global-strict-fairness-policy"

    def select_flow(self, band: BandView, now: float) -> FlowView | None:
        best: FlowView | None = None
        best_key: tuple[Any, ...] = ()
        for flow in band.active_flows():
            if not len(flow):
                continue
            key = flow.head_key()
            if best is None or key < best_key:
                best, best_key = flow, key
        return best


@dataclass
class _Cursor:
    last: str | None = None


class RoundRobinFairnessPolicy(_NoAccounting, PluginBase):
    TYPE: ClassVar[str] = "round-robin-fairness-policy"

    def new_state(self) -> Any:
        return _Cursor()

    def select_flow(self, band: BandView, now: float) -> FlowView | None:
        flows = {f.flow_id: f for f in band.active_flows() if len(f)}
        if not flows:
            return None
        ids = sorted(flows)
        cursor: _Cursor = band.state
        start = 0 if cursor.last is None else bisect.bisect_right(ids, cursor.last)
        return flows[ids[start % len(ids)]]

    def on_dispatch(self, band: BandView, flow: FlowView, item: QueuedRequest, now: float) -> None:
        cursor: _Cursor = band.state
        cursor.last = flow.flow_id
