"""``label-selector-filter``: keep endpoints whose labels match a Kubernetes label selector.

Semantics are those of ``metav1.LabelSelector``: every ``matchLabels`` pair and every
``matchExpressions`` requirement must hold; an empty selector keeps every endpoint.

- ``In``: the label exists and its value is one of ``values``.
- ``NotIn``: the label is absent or its value is none of ``values``.
- ``Exists`` / ``DoesNotExist``: the label key is present / absent (``values`` must be empty).

Parameters:

- ``matchLabels`` (map string -> string, default empty).
- ``matchExpressions`` (list of ``{key, operator, values}``, default empty); ``operator`` is one of
  ``In``, ``NotIn``, ``Exists``, ``DoesNotExist``. ``In``/``NotIn`` need at least one value.

YAML::

    plugins:
      - type: label-selector-filter
        name: decode-pods
        parameters:
          matchLabels:
            llm-d.ai/role: decode
          matchExpressions:
            - key: topology.kubernetes.io/zone
              operator: In
              values: [zone-a, zone-b]
            - key: maintenance
              operator: DoesNotExist
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from epp.plugin import CycleState, Endpoint, InferenceRequest, PluginBase

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` entry."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.key:
            raise ValueError("key must not be empty")
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        return not present


class LabelSelectorFilter(PluginBase):
    TYPE: ClassVar[str] = "label-selector-filter"

    @dataclass(frozen=True)
    class Params:
        match_labels: dict[str, str] = field(default_factory=dict)
        match_expressions: tuple[Requirement, ...] = ()

    params: Params

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        return [ep for ep in endpoints if self._matches(ep.labels)]

    def _matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in self.params.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.params.match_expressions)
