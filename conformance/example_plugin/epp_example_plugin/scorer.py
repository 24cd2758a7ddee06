"""``example-label-scorer``: prefer endpoints whose label ``label`` has the value ``value``.

score = 1.0 for such an endpoint, 0.0 for any other (category Affinity).

Parameters: ``label`` (required), ``value`` (required).

YAML::

    plugins:
    - type: example-label-scorer
      parameters: {label: tier, value: gold}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase, ScorerCategory


class LabelScorer(PluginBase):
    TYPE: ClassVar[str] = "example-label-scorer"
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        label: str = ""
        value: str = ""

        def __post_init__(self) -> None:
            if not self.label:
                raise ValueError("label is required")

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        label, value = self.params.label, self.params.value
        return {e.id: 1.0 if e.labels.get(label) == value else 0.0 for e in endpoints}
