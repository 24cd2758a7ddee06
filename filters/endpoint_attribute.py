"""``endpoint-attribute-filter`` (alpha): keep endpoints whose numeric attribute passes a threshold.

An endpoint is kept when ``<its value> <operator> <value>`` holds. The attribute is a numeric
endpoint attribute: with ``producer`` omitted, a custom metric of ``core-metrics-extractor``
(``engineConfigs[].customMetrics[].attributeKey``); with ``producer`` set, the value that plugin
publishes, e.g. ``attribute: GPUUtilization`` with ``producer: dcgm-extractor`` (see
``epp.plugin.attributes``).

Parameters:

* ``attribute`` (required): the attribute name, e.g. ``num_requests_running``. A name containing
  ``/`` is rejected unless ``producer`` is set (it is most likely the old combined
  ``Attribute/Producer`` spelling);
* ``producer``: the plugin publishing it; omitted = ``core-metrics-extractor``; ``""`` = a
  producer-agnostic attribute;
* ``onMissing``: ``Pass`` (default; ``""`` too) keeps an endpoint without the attribute,
  ``Fail`` drops it;
* ``fallbackOnEmpty``: default false; when true and every endpoint was dropped, the candidates are
  returned unfiltered, so the request can still be routed;
* ``algorithm.type`` (required): ``threshold``, the only algorithm;
* ``algorithm.threshold.operator`` (required): ``LessThan``, ``LessThanOrEqual``, ``GreaterThan``,
  ``GreaterThanOrEqual``, ``Equal`` or ``NotEqual``;
* ``algorithm.threshold.value``: the number compared against, default 0.

A non-finite value counts as missing. YAML example (drop GPUs busier than 90%, never all)::

    plugins:
    - type: endpoint-attribute-filter
      name: gpu-utilization-filter
      parameters:
        attribute: GPUUtilization
        producer: dcgm-extractor
        onMissing: Pass
        fallbackOnEmpty: true
        algorithm:
          type: threshold
          threshold:
            operator: LessThanOrEqual
            value: 0.90
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from epp.plugin import CycleState, Endpoint, Handle, InferenceRequest, PluginBase, Stability
from epp.plugin.attributes import ScalarAttribute

_WHAT: Final = "endpoint attribute filter"
OPERATORS: Final[dict[str, Callable[[float, float], bool]]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


@dataclass(frozen=True)
class Threshold:
    operator: str = ""
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.operator not in OPERATORS:
            raise ValueError(
                f"{_WHAT} threshold.operator must be one of {', '.join(OPERATORS)}, "
                f"got {self.operator!r}"
            )


@dataclass(frozen=True)
class Algorithm:
    type: str = ""
    threshold: Threshold | None = None


class EndpointAttributeFilter(PluginBase):
    TYPE: ClassVar[str] = "endpoint-attribute-filter"
    STABILITY: ClassVar[Stability] = Stability.ALPHA

    @dataclass(frozen=True)
    class Params:
        attribute: str = ""
        producer: str | None = None
        on_missing: str = "Pass"
        fallback_on_empty: bool = False
        algorithm: Algorithm = field(default_factory=Algorithm)

        def __post_init__(self) -> None:
            if not self.attribute:
                raise ValueError(f"{_WHAT} requires a non-empty attribute")
            if self.on_missing not in ("", "Pass", "Fail"):
                raise ValueError(
                    f"{_WHAT} onMissing must be 'Pass' or 'Fail', got {self.on_missing!r}"
                )
            if self.algorithm.type != "threshold":
                raise ValueError(
                    f"{_WHAT} algorithm.type must be 'threshold', got {self.algorithm.type!r}"
                )
            if self.algorithm.threshold is None:
                raise ValueError(
                    f"{_WHAT} requires algorithm.threshold when algorithm.type is 'threshold'"
                )
            ScalarAttribute.resolve(self.attribute, self.producer, _WHAT)

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self.source = ScalarAttribute.resolve(params.attribute, params.producer, _WHAT)
        threshold = params.algorithm.threshold
        assert threshold is not None  # checked by Params
        self._compare = OPERATORS[threshold.operator]
        self._value = threshold.value
        self._pass_missing = params.on_missing != "Fail"

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        kept = [ep for ep in endpoints if self._keeps(ep)]
        if not kept and self.params.fallback_on_empty:
            return endpoints
        return kept

    def _keeps(self, endpoint: Endpoint) -> bool:
        value = self.source.read(endpoint)
        if value is None:
            return self._pass_missing
        return self._compare(value, self._value)
