"""Usage-limit policies: one saturation ceiling per priority band, computed once per cycle.

The dispatch loop visits bands from the highest priority down and stops at the first band whose
ceiling is at or below the pool saturation (``saturation >= ceiling``). ``priorities`` are the
provisioned bands, highest first; ``i`` is a band's index there and ``N`` their count.

``static-usage-limit-policy`` (default): ``ceiling_i = threshold`` for every band.

- ``threshold`` (float, default 1.0, in (0, 1]).

``priority-holdback-policy`` (alpha): lower priorities are held back first. With
``cmin = minCeiling`` and ``cmax = maxCeiling``; a single band gets ``cmax``::

    domain rank:   ceiling_i = cmax - i * (cmax - cmin) / (N - 1)
    domain value:  r_i = (p_i - p_min) / (p_max - p_min)      # all equal -> ceiling_i = cmax
                   ceiling_i = cmin + r_i * (cmax - cmin)

- ``shape`` (``linear``, the only one), ``domain`` (``rank`` | ``value``, default ``rank``).
- ``minCeiling`` (float, required, in [0, 1)), ``maxCeiling`` (float, default 1.0, in (0, 1],
  > minCeiling).

``soft-reflective-ceiling-policy`` (alpha, no parameters): band 0 always gets 1.0. For ``i >= 1``
with ``s`` the saturation::

    reflective_i = 1 - i * s / (N - 1)
    s <  reflective_i        -> 1.0    (open)
    s >= 1                   -> 0.0    (closed)
    otherwise                -> open on one call in period = max(1, round(s / (1 - s))),
                                closed on the others

All alternating bands share one tick counter (advanced only on calls where some band alternates),
so within a call they are all open or all closed, and the lowest bands get a dispatch rate of
about ``(1 - s) / s``.

YAML::

    plugins:
      - type: priority-holdback-policy
        name: holdback
        parameters: {domain: rank, minCeiling: 0.4, maxCeiling: 0.9}
    flowControl:
      usageLimitPolicyPluginRef: holdback
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from epp.plugin import Handle, PluginBase, Stability


class StaticUsageLimitPolicy(PluginBase):
    TYPE: ClassVar[str] = "static-usage-limit-policy"

    @dataclass(frozen=True)
    class Params:
        threshold: float = 1.0

        def __post_init__(self) -> None:
            if not 0.0 < self.threshold <= 1.0:
                raise ValueError(f"threshold must be in (0, 1], got {self.threshold}")

    params: Params

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        return [self.params.threshold] * len(priorities)


class PriorityHoldbackPolicy(PluginBase):
    TYPE: ClassVar[str] = "priority-holdback-policy"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        min_ceiling: float
        shape: Literal["linear"] = "linear"
        domain: Literal["rank", "value"] = "rank"
        max_ceiling: float = 1.0

        def __post_init__(self) -> None:
            if not 0.0 <= self.min_ceiling < 1.0:
                raise ValueError(f"minCeiling must be in [0, 1), got {self.min_ceiling}")
            if not 0.0 < self.max_ceiling <= 1.0:
                raise ValueError(f"maxCeiling must be in (0, 1], got {self.max_ceiling}")
            if self.min_ceiling >= self.max_ceiling:
                raise ValueError(
                    f"minCeiling ({self.min_ceiling}) must be less than maxCeiling "
                    f"({self.max_ceiling})"
                )

    params: Params

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        n = len(priorities)
        cmin, cmax = self.params.min_ceiling, self.params.max_ceiling
        if n <= 1:
            return [cmax] * n
        if self.params.domain == "rank":
            step = (cmax - cmin) / (n - 1)
            return [cmax - i * step for i in range(n)]
        p_max, p_min = priorities[0], priorities[-1]
        if p_max == p_min:
            return [cmax] * n
        return [cmin + (p - p_min) / (p_max - p_min) * (cmax - cmin) for p in priorities]


class SoftReflectiveCeilingPolicy(PluginBase):
    TYPE: ClassVar[str] = "soft-reflective-ceiling-policy"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._tick = 0

    def compute_limit(self, saturation: float, priorities: Sequence[int]) -> Sequence[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        s = saturation
        # Ceilings fall with rank, so some band alternates iff the lowest one (ceiling 1 - s) does.
        open_now = False
        if 1.0 - s <= s < 1.0:
            # The epsilon keeps the period finite when s is within rounding of 1; halves round
            # up, as Go's math.Round does.
            period = max(1, math.floor(s / (1.0 - s + 1e-9) + 0.5))
            self._tick += 1
            open_now = self._tick % period == 0
        ceilings = [1.0]
        for i in range(1, n):
            reflective = 1.0 - i * s / (n - 1)
            if s < reflective:
                ceilings.append(1.0)
            elif s >= 1.0:
                ceilings.append(0.0)
            else:
                ceilings.append(1.0 if open_now else 0.0)
        return ceilings
