"""OpenTelemetry tracing of requests: ``--tracing`` and the standard ``OTEL_*`` variables.

Each App has its own ``TracerProvider`` (nothing global is set). With tracing on, every request
gets a server span ``gateway.request``, continuing the trace of the client's W3C ``traceparent``
when it sent one, and the EPP sets ``traceparent`` (and ``tracestate``) on the request the model
server receives (a header mutation), so the model server's spans join the same trace. Under it,
once routing ends, ``gateway.request_orchestration`` (with the error when routing failed) holds:

- ``llm_d.epp.parse``: parser resolution, parsing and the target model (rewrites);
- ``llm_d.epp.admission``: flow control or legacy shedding (queue time included);
- ``run_scheduler_profile`` per scheduling profile run (``llm_d.epp.scheduling.profile.name``),
  holding upstream's three stages: ``filter_endpoints`` (``llm_d.epp.filter.candidate_endpoints``
  and ``.filtered_endpoints``), ``llm_d.epp.scoring`` (``llm_d.epp.scorer.count``,
  ``llm_d.epp.scoring.candidate_endpoints``) and ``pick_endpoints``
  (``llm_d.epp.picker.candidate_endpoints``, and the five best candidates with their weighted
  scores, best first, ties by id: ``llm_d.epp.picker.top_endpoints`` / ``.top_scores``), each with
  ``gen_ai.request.model`` and ``gen_ai.request.id``;
- one span per plugin call that took at least ``--tracing-plugin-threshold`` (1ms by default):
  ``llm_d.epp.producer.<type>``, ``llm_d.epp.filter.<type>``, ``llm_d.epp.scorer.<type>``,
  ``llm_d.epp.picker.<type>``, each with ``llm_d.epp.plugin.type`` and ``.name``, under its
  stage's span;
- the spans plugins record through ``epp.plugin.spans`` (the request's ``SpanSink`` is this
  ``RequestTrace``), e.g. ``prepare_disaggregation`` with ``llm_d.epp.pd.*`` and ``mm.*``.

These child spans are recorded as timestamps while the request is routed and turned into spans
afterwards (with their real start and end times), so an unsampled request costs a few list
appends, and with tracing off the request path only tests ``trace is None``.

Variables (upstream's semantics):

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP over gRPC; ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
  ``..._TRACES_ENDPOINT``, ``..._INSECURE``, ``..._CERTIFICATE``, ``..._HEADERS``,
  ``..._TIMEOUT`` as the OpenTelemetry SDK reads them; with none of the transport variables set,
  ``localhost:4317`` in plaintext, as upstream), ``console`` (spans on stdout), ``none``;
  another value is logged as an error and tracing stays off.
  Deliberate difference: unset, upstream prints spans on stdout; here tracing stays off (one
  log line says so) unless an OTLP endpoint variable is set, which selects ``otlp``.
- ``OTEL_SERVICE_NAME`` (default ``llm-d-epp``) and ``OTEL_RESOURCE_ATTRIBUTES``.
- ``OTEL_TRACES_SAMPLER`` (default ``parentbased_traceidratio``; also ``always_on``,
  ``always_off``, ``traceidratio``, ``parentbased_always_on``, ``parentbased_always_off``) and
  ``OTEL_TRACES_SAMPLER_ARG`` (the ratio, default ``0.1``; a bad value is ``0.1``). An unknown
  sampler is logged and replaced by the default, as upstream.
- ``OTEL_BSP_*``: the batch span processor's delays and sizes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

log = logging.getLogger(__name__)

SERVICE_NAME: Final = "llm-d-epp"
SCOPE: Final = "llm-d-router/pkg/epp"
TRACE_KEY: Final = "epp.trace"
"""``CycleState.data`` key of the request's ``RequestTrace`` while it is scheduled."""
DEFAULT_RATIO: Final = 0.1
_OTLP_TRANSPORT: Final = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_INSECURE",
    "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
)
_POINTS: Final = {
    "DataProducer": "producer",
    "Filter": "filter",
    "Scorer": "scorer",
    "Picker": "picker",
}


def sampler_from(environ: Mapping[str, str]) -> Sampler:
    name = environ.get("OTEL_TRACES_SAMPLER", "parentbased_traceidratio").strip().lower()
    try:
        ratio = float(environ.get("OTEL_TRACES_SAMPLER_ARG", str(DEFAULT_RATIO)))
    except ValueError:
        ratio = DEFAULT_RATIO
    if not 0.0 <= ratio <= 1.0:
        ratio = DEFAULT_RATIO
    known: dict[str, Sampler] = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "traceidratio": TraceIdRatioBased(ratio),
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
        "parentbased_traceidratio": ParentBased(TraceIdRatioBased(ratio)),
    }
    if name not in known:
        log.error(
            "unsupported sampler type, falling back to parentbased_traceidratio",
            extra={"sampler": name, "ratio": ratio},
        )
        return known["parentbased_traceidratio"]
    return known[name]


def exporter_from(environ: Mapping[str, str]) -> SpanExporter | None:
    """The exporter ``OTEL_TRACES_EXPORTER`` names, or ``None`` (tracing off)."""
    kind = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not kind:
        endpoint = any(environ.get(k) for k in _OTLP_TRANSPORT[:2])
        kind = "otlp" if endpoint else ""
    if kind in ("", "none"):
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER: {kind!r} is not one of otlp, console, none")
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as exc:  # e.g. another wheel's copy of opentelemetry/proto installed over it
        raise ValueError(
            f"the OTLP exporter cannot be loaded ({exc}): reinstall opentelemetry-proto "
            "(pip install --force-reinstall --no-deps opentelemetry-proto)"
        ) from None

    if any(k in environ for k in _OTLP_TRANSPORT):
        return OTLPSpanExporter()
    return OTLPSpanExporter(endpoint="localhost:4317", insecure=True)


class Tracing:
    """One App's tracing. ``begin`` is ``None``-returning cheap when tracing is off."""

    def __init__(
        self,
        *,
        exporter: SpanExporter,
        sampler: Sampler,
        plugin_threshold: float = 0.001,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or SERVICE_NAME})
        self.provider = TracerProvider(resource=resource, sampler=sampler)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer(SCOPE)
        self.propagator: TextMapPropagator = TraceContextTextMapPropagator()
        self.plugin_threshold_ns = int(plugin_threshold * 1e9)

    @classmethod
    def from_environment(
        cls, enabled: bool, plugin_threshold: float, environ: Mapping[str, str] | None = None
    ) -> Tracing | None:
        """The tracing ``--tracing`` and the variables ask for; ``None`` when off (also when
        ``OTEL_TRACES_EXPORTER`` names an exporter we do not have: logged as an error)."""
        env = os.environ if environ is None else environ
        if not enabled:
            return None
        try:
            exporter = exporter_from(env)
        except ValueError as exc:
            log.error("tracing is off", extra={"reason": str(exc)})
            return None
        if exporter is None:
            log.info(
                "tracing is on but no exporter is configured: set OTEL_TRACES_EXPORTER "
                "(otlp, console) or OTEL_EXPORTER_OTLP_ENDPOINT to export spans"
            )
            return None
        log.info("tracing: exporting spans", extra={"exporter": type(exporter).__name__})
        return cls(
            exporter=exporter,
            sampler=sampler_from(env),
            plugin_threshold=plugin_threshold,
            environ=env,
        )

    def begin(self, headers: Mapping[str, str], request_id: str) -> RequestTrace:
        parent = self.propagator.extract(headers)
        root = self.tracer.start_span(
            "gateway.request",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"llm_d.epp.request_id": request_id},
        )
        return RequestTrace(self, root)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (bounded by the processor's export timeout)."""
        self.provider.shutdown()


class RequestTrace:
    """The spans of one request: the live root, and child records turned into spans later."""

    __slots__ = (
        "_open",
        "_records",
        "_stage",
        "context",
        "error",
        "recording",
        "root",
        "status",
        "tracing",
    )

    def __init__(self, tracing: Tracing, root: trace.Span) -> None:
        self.tracing = tracing
        self.root = root
        self.context: Context = trace.set_span_in_context(root)
        self.recording = root.is_recording()
        self._records: list[tuple[str, int, int, dict[str, Any], int]] = []
        self._open = -1
        self._stage = -1
        self.error = ""
        self.status = 0
        """The HTTP status the EPP answered with itself (an ImmediateResponse), else 0."""

    def headers(self) -> dict[str, str]:
        """``traceparent`` (and ``tracestate``) for the request to the model server."""
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=self.context)
        return carrier

    def phase(self, name: str, start_ns: int, end_ns: int, **attributes: Any) -> None:
        if self.recording:
            self._records.append((name, start_ns, end_ns, attributes, -1))

    def open_profile(self, name: str) -> None:
        if self.recording:
            attributes = {"llm_d.epp.scheduling.profile.name": name}
            self._records.append(("run_scheduler_profile", time.time_ns(), 0, attributes, -1))
            self._open = len(self._records) - 1

    def close_profile(self) -> None:
        self.close_stage()  # a stage that raised
        if self._open >= 0:
            name, start, _, attributes, parent = self._records[self._open]
            self._records[self._open] = (name, start, time.time_ns(), attributes, parent)
            self._open = -1

    def open_stage(self, name: str, attributes: dict[str, Any]) -> None:
        """A stage of the profile being run (``filter_endpoints``, ``llm_d.epp.scoring``,
        ``pick_endpoints``) starts; plugin spans nest under it until ``close_stage``."""
        if self.recording:
            self._records.append((name, time.time_ns(), 0, attributes, self._open))
            self._stage = len(self._records) - 1

    def close_stage(self, **attributes: Any) -> None:
        if self._stage >= 0:
            name, start, _, recorded, parent = self._records[self._stage]
            recorded.update(attributes)
            self._records[self._stage] = (name, start, time.time_ns(), recorded, parent)
            self._stage = -1

    def add_span(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]
    ) -> None:
        """A plugin's span (``epp.plugin.spans.SpanSink``), under the current stage or profile."""
        if self.recording:
            parent = self._stage if self._stage >= 0 else self._open
            self._records.append((name, start_ns, end_ns, dict(attributes), parent))

    def plugin(self, point: str, typed_name: Any, seconds: float) -> None:
        """A plugin call of ``seconds`` that just ended; kept when over the threshold."""
        took = int(seconds * 1e9)
        if not self.recording or took < self.tracing.plugin_threshold_ns:
            return
        end = time.time_ns()
        attributes = {"llm_d.epp.plugin.type": typed_name.type}
        attributes["llm_d.epp.plugin.name"] = typed_name.name
        name = f"llm_d.epp.{_POINTS.get(point, point.lower())}.{typed_name.type}"
        parent = self._stage if self._stage >= 0 else self._open
        self._records.append((name, end - took, end, attributes, parent))

    def routed(self, error: BaseException | None = None) -> None:
        """Routing ended (decided or failed): emit the orchestration span and its children."""
        self.close_profile()  # a profile that raised
        if not self.recording or not self._records:
            return
        tracer = self.tracing.tracer
        start = min(r[1] for r in self._records)
        end = max(max(r[1], r[2]) for r in self._records)
        orchestration = tracer.start_span(
            "gateway.request_orchestration",
            context=self.context,
            kind=trace.SpanKind.SERVER,
            start_time=start,
        )
        if error is not None:
            orchestration.record_exception(error)
            orchestration.set_status(Status(StatusCode.ERROR, str(error)))
        parent_ctx = trace.set_span_in_context(orchestration)
        spans: list[trace.Span] = []
        for name, t0, t1, attributes, parent in self._records:
            ctx = trace.set_span_in_context(spans[parent]) if parent >= 0 else parent_ctx
            span = tracer.start_span(name, context=ctx, start_time=t0, attributes=attributes)
            spans.append(span)
            span.end(end_time=max(t0, t1))
        orchestration.end(end_time=end)
        self._records.clear()

    def end(self, status: int) -> None:
        """The request is over; ``status`` is the HTTP status the client got (0 if unknown)."""
        if status:
            self.root.set_attribute("http.response.status_code", status)
        if self.error or status >= 500:
            self.root.set_status(Status(StatusCode.ERROR, self.error or f"HTTP {status}"))
        self.root.end()
