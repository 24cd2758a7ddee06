"""``by-label`` and ``by-label-selector`` (deprecated upstream since v0.9.0): label filters that
older configs name. New configs use ``label-selector-filter``, or ``decode-filter`` /
``prefill-filter`` / ``encode-filter`` for roles. Each logs its deprecation once at startup.

``by-label`` keeps an endpoint whose label ``label`` has one of ``validValues``, or, with
``allowsNoLabel``, one that does not carry the label at all. Parameters:

- ``label`` (string, required);
- ``validValues`` (list of strings, default empty);
- ``allowsNoLabel`` (bool, default false); ``validValues`` must be non-empty unless it is true.

``by-label-selector`` is ``label-selector-filter`` under its old name: same parameters
(``matchLabels``, ``matchExpressions``) and semantics; it builds that filter through
``Handle.create_plugin`` and delegates to it.

YAML::

    plugins:
      - type: by-label
        name: decode-pods
        parameters: {label: llm-d.ai/role, validValues: [decode, both], allowsNoLabel: true}
      - type: by-label-selector
        parameters:
          matchLabels: {llm-d.ai/role: decode}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from epp.plugin import CycleState, Endpoint, Handle, InferenceRequest, PluginBase

_DEPRECATED = (
    "plugin type %r is deprecated: use label-selector-filter for label filtering, or "
    "decode-filter / prefill-filter / encode-filter for roles"
)


class ByLabel(PluginBase):
    TYPE: ClassVar[str] = "by-label"

    @dataclass(frozen=True)
    class Params:
        label: str = ""
        valid_values: tuple[str, ...] = ()
        allows_no_label: bool = False

        def __post_init__(self) -> None:
            if not self.label:
                raise ValueError("'label' must be specified")
            if not self.valid_values and not self.allows_no_label:
                raise ValueError("either 'validValues' must be non-empty or 'allowsNoLabel' true")

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        handle.logger(self.typed_name).warning(_DEPRECATED, self.TYPE)
        self._valid = frozenset(self.params.valid_values)

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        label, valid, no_label = self.params.label, self._valid, self.params.allows_no_label
        return [
            ep
            for ep in endpoints
            if (label not in ep.labels and no_label) or ep.labels.get(label) in valid
        ]


class ByLabelSelector(PluginBase):
    TYPE: ClassVar[str] = "by-label-selector"

    @dataclass(frozen=True)
    class Params:
        """``label-selector-filter``'s parameters, passed on to it as they are."""

        match_labels: Mapping[str, Any] | None = None
        match_expressions: tuple[Any, ...] | None = None

    params: Params

    def __init__(self, *, name: str, params: Any, handle: Handle) -> None:
        super().__init__(name=name, params=params, handle=handle)
        handle.logger(self.typed_name).warning(_DEPRECATED, self.TYPE)
        given = {"matchLabels": params.match_labels, "matchExpressions": params.match_expressions}
        parameters = {k: (list(v) if isinstance(v, tuple) else v) for k, v in given.items() if v}
        self._selector = handle.create_plugin(
            "label-selector-filter", name or self.TYPE, parameters
        )

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        result: Sequence[Endpoint] = self._selector.filter(cycle, request, endpoints)
        return result
