"""``endpoint-attribute-scorer`` (alpha): score endpoints by a numeric attribute, linearly
(category Distribution).

With ``v`` the endpoint's value and ``[min, max]`` the range of the normalization::

    n = (v - min) / (max - min)                       # fixedRange: clamped to [0, 1]
    score = 1 - n  (linear_lower_is_better)   or   n  (linear_higher_is_better)

* ``adaptiveRange`` (the default): ``min`` and ``max`` are the lowest and highest value among the
  candidates that have the attribute; when they are equal every such candidate scores 1.0;
* ``fixedRange``: the configured ``min`` and ``max`` (``min < max``), for attributes with known
  bounds such as a utilization in [0, 1].

An endpoint without the attribute (or with a non-finite value) scores 0 and takes no part in the
adaptive range. The attribute is read as by ``endpoint-attribute-filter``: with ``producer``
omitted a custom metric of ``core-metrics-extractor``, otherwise the value that plugin publishes
(see ``epp.plugin.attributes``).

Parameters:

* ``attributeKey`` (required): the attribute name; a name containing ``/`` is rejected unless
  ``producer`` is set;
* ``producer``: omitted = ``core-metrics-extractor``; ``""`` = a producer-agnostic attribute;
* ``algorithm.type`` (required): ``linear_lower_is_better`` or ``linear_higher_is_better``;
* ``algorithm.normalization``: at most one of ``adaptiveRange: {}`` (default) and
  ``fixedRange: {min, max}``.

YAML example (prefer idle GPUs)::

    plugins:
    - type: endpoint-attribute-scorer
      name: gpu-utilization-scorer
      parameters:
        attributeKey: GPUUtilization
        producer: dcgm-extractor
        algorithm:
          type: linear_lower_is_better
          normalization:
            fixedRange: {min: 0.0, max: 1.0}
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: gpu-utilization-scorer
        weight: 2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
)
from epp.plugin.attributes import ScalarAttribute

_WHAT: Final = "endpoint attribute scorer"
ALGORITHMS: Final = ("linear_lower_is_better", "linear_higher_is_better")


@dataclass(frozen=True)
class FixedRange:
    min: float = field(default=0.0, metadata={"yaml": "min"})
    max: float = field(default=0.0, metadata={"yaml": "max"})


@dataclass(frozen=True)
class AdaptiveRange:
    pass


@dataclass(frozen=True)
class Normalization:
    fixed_range: FixedRange | None = None
    adaptive_range: AdaptiveRange | None = None

    def __post_init__(self) -> None:
        if self.fixed_range is not None and self.adaptive_range is not None:
            raise ValueError(
                f"{_WHAT} allows at most one normalization strategy, got both fixedRange and "
                "adaptiveRange"
            )
        fixed = self.fixed_range
        if fixed is not None and not fixed.min < fixed.max:
            raise ValueError(
                f"{_WHAT} normalization.fixedRange requires min < max, got min {fixed.min}, "
                f"max {fixed.max}"
            )


@dataclass(frozen=True)
class Algorithm:
    type: str = ""
    normalization: Normalization = field(default_factory=Normalization)


class EndpointAttributeScorer(PluginBase):
    TYPE: ClassVar[str] = "endpoint-attribute-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.DISTRIBUTION

    @dataclass(frozen=True)
    class Params:
        attribute_key: str = ""
        producer: str | None = None
        algorithm: Algorithm = field(default_factory=Algorithm)

        def __post_init__(self) -> None:
            if not self.attribute_key:
                raise ValueError(f"{_WHAT} requires a non-empty attributeKey")
            if self.algorithm.type not in ALGORITHMS:
                raise ValueError(
                    f"{_WHAT} algorithm.type must be {' or '.join(ALGORITHMS)}, "
                    f"got {self.algorithm.type!r}"
                )
            ScalarAttribute.resolve(self.attribute_key, self.producer, _WHAT)

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.source = ScalarAttribute.resolve(params.attribute_key, params.producer, _WHAT)
        self._lower_is_better = params.algorithm.type == "linear_lower_is_better"
        self._fixed = params.algorithm.normalization.fixed_range

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        values = {ep.id: v for ep in endpoints if (v := self.source.read(ep)) is not None}
        if self._fixed is not None:
            low, high = self._fixed.min, self._fixed.max
        elif values:
            low, high = min(values.values()), max(values.values())
        else:
            return dict.fromkeys((ep.id for ep in endpoints), 0.0)
        return {ep.id: self._normalized(values.get(ep.id), low, high) for ep in endpoints}

    def _normalized(self, value: float | None, low: float, high: float) -> float:
        if value is None:
            return 0.0
        if high == low:  # adaptive range, one value among the candidates: neutral
            return 1.0
        n = min(1.0, max(0.0, (value - low) / (high - low)))
        return 1.0 - n if self._lower_is_better else n
