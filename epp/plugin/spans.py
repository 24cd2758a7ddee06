"""Spans a plugin adds to a traced request.

When a request is traced and sampled, the engine puts a ``SpanSink`` in its attributes
(``request_spans(request)``); otherwise there is none, so a plugin pays one dictionary lookup per
request. A plugin records a span with its start and end (``time.time_ns()``) and attributes;
the engine turns it into a child of the scheduling profile being run, or of the request's
orchestration span, once routing ends::

    spans = request_spans(request)
    if spans is not None:
        t0 = time.time_ns()
        ...
        spans.add_span("prepare_disaggregation", t0, time.time_ns(), {"llm_d.epp.pd.reason": "x"})

``request_span_attributes`` gives upstream's ``gen_ai.request.model`` / ``gen_ai.request.id`` and
``mm.modality`` / ``mm.hash_count`` of a request, which upstream's plugin spans carry.
Attribute values are strings, booleans, numbers or sequences of one of them (OpenTelemetry's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from epp.plugin.multimodal import media_summary
from epp.plugin.types import InferenceRequest

SPAN_SINK: Final = "epp.trace/spans"
"""``InferenceRequest.attributes`` key of the request's ``SpanSink`` (only when sampled)."""


class SpanSink(Protocol):
    def add_span(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]
    ) -> None: ...


def request_spans(request: InferenceRequest) -> SpanSink | None:
    """The request's span sink, or ``None`` when it is not traced (or not sampled)."""
    sink: SpanSink | None = request.attributes.get(SPAN_SINK)
    return sink


def request_span_attributes(request: InferenceRequest) -> dict[str, Any]:
    """``gen_ai.request.model`` (when set), ``gen_ai.request.id``, ``mm.modality`` and
    ``mm.hash_count`` of ``request``."""
    modality, count = media_summary(request.body)
    out: dict[str, Any] = {}
    if request.target_model:
        out["gen_ai.request.model"] = request.target_model
    out["gen_ai.request.id"] = request.request_id
    out["mm.modality"] = modality
    out["mm.hash_count"] = count
    return out
