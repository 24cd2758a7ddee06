"""Flow control (llm-d's ``framework/interface/flowcontrol``): the ``SaturationDetector``
admission and the flow controller read. The flow-control policies (fairness, ordering, usage
limits, eviction, priority adjusters) and the queued requests they see are in
``epp.plugin.flow``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from epp.plugin.types import (
    Endpoint,
    TypedName,
)


@runtime_checkable
class SaturationDetector(Protocol):
    typed_name: TypedName

    def saturation(self, now: float, endpoints: Sequence[Endpoint]) -> float: ...
