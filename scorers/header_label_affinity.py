"""``header-label-affinity-scorer`` (alpha): prefer endpoints whose label equals a request header
(category Affinity).

Formula, with ``h`` the value of the request header ``headerName`` and ``v`` the endpoint's label
``labelKey``::

    score = 1   if h is set and v == h
            0   otherwise (no header, an unknown value, or an endpoint without the label)

A soft preference: no endpoint is removed, and the profile weight says how much the match is
worth against the other scorers (a weight above the largest weighted difference those can make
wins whenever a matching endpoint is a candidate). Configure one instance per header and label,
each with its own weight. The scorer sets no response header: the
``disaggregatedset-rollout-screener``'s ``prefer`` selectors stamp the label a later request
sends back (e.g. a DisaggregatedSet slice, one NVLink domain, so that the decode pick stays in
the prefill's domain).

Parameters (both required): ``headerName`` (matched case-insensitively, as HTTP headers are) and
``labelKey``.

YAML::

    plugins:
    - type: header-label-affinity-scorer
      name: slice-affinity
      parameters:
        headerName: x-disagg-slice
        labelKey: disaggregatedset.x-k8s.io/slice
    schedulingProfiles:
    - name: decode
      plugins:
      - pluginRef: slice-affinity
        weight: 3
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from epp.plugin import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginBase,
    ScorerCategory,
    Stability,
)


class HeaderLabelAffinityScorer(PluginBase):
    TYPE: ClassVar[str] = "header-label-affinity-scorer"
    STABILITY: ClassVar[Stability] = Stability.ALPHA
    category: ClassVar[ScorerCategory] = ScorerCategory.AFFINITY

    @dataclass(frozen=True)
    class Params:
        header_name: str = ""
        label_key: str = ""

        def __post_init__(self) -> None:
            if not self.header_name:
                raise ValueError("header-label-affinity-scorer headerName is required")
            if not self.label_key:
                raise ValueError("header-label-affinity-scorer labelKey is required")

    params: Params

    def __init__(self, *, name: str, params: Params, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        self._header = params.header_name.lower()
        self._label = params.label_key

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[str, float]:
        wanted = request.headers.get(self._header)
        if not wanted:
            return dict.fromkeys((e.id for e in endpoints), 0.0)
        label = self._label
        return {e.id: 1.0 if e.labels.get(label) == wanted else 0.0 for e in endpoints}
