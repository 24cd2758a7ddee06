"""OpenTelemetry tracing through a real Envoy: the spans reach an OTLP gRPC collector (a tiny
in-process TraceService), continue the client's trace, and the model server receives the
``traceparent`` of the EPP's request span."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.conftest import COMPLETION, post

pytestmark = [pytest.mark.envoy]

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[tuple[str, trace_pb2.Span]] = []
        self.arrived = asyncio.Event()

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                self.spans += [(attrs.get("service.name", ""), s) for s in scope.spans]
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    async def wait_for(self, name: str, trace_id: str) -> list[trace_pb2.Span]:
        async with asyncio.timeout(15):
            while True:
                mine = [s for _, s in self.spans if s.trace_id.hex() == trace_id]
                if any(s.name == name for s in mine):
                    return mine
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def collector(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Collector]:
    servicer = Collector()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_SERVICE_NAME": "epp-under-test",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    yield servicer
    await server.stop(None)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind)


def _attributes(span: trace_pb2.Span) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


def _by_name(spans: list[trace_pb2.Span]) -> dict[str, list[trace_pb2.Span]]:
    out: dict[str, list[trace_pb2.Span]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


async def test_request_spans_reach_the_collector_when_a_client_sends_traceparent(
    collector: Collector, start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports, tracing_plugin_threshold=0.0)
    proxy = envoy(app)
    parent = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
    status, headers, body = await post(f"{proxy.url}/v1/completions", COMPLETION, parent)
    assert status == 200, body[:300]

    spans = _by_name(await collector.wait_for("gateway.request", CLIENT_TRACE))
    (root,) = spans["gateway.request"]
    assert root.parent_span_id.hex() == CLIENT_SPAN  # the client's trace continues
    assert root.kind == trace_pb2.Span.SPAN_KIND_SERVER
    (orchestration,) = spans["gateway.request_orchestration"]
    assert orchestration.parent_span_id == root.span_id
    for name in ("llm_d.epp.parse", "llm_d.epp.admission", "run_scheduler_profile"):
        (child,) = spans[name]
        assert child.parent_span_id == orchestration.span_id, name
    (profile,) = spans["run_scheduler_profile"]
    (filtering,) = spans["filter_endpoints"]
    (scoring,) = spans["llm_d.epp.scoring"]
    (picking,) = spans["pick_endpoints"]
    for stage in (filtering, scoring, picking):
        assert stage.parent_span_id == profile.span_id, stage.name
    plugins = [s for n, group in spans.items() if n.startswith("llm_d.epp.scorer.") for s in group]
    assert plugins and all(s.parent_span_id == scoring.span_id for s in plugins)
    (picker,) = spans["llm_d.epp.picker.max-score-picker"]
    assert picker.parent_span_id == picking.span_id
    attrs = _attributes(scoring)
    assert attrs["llm_d.epp.scoring.candidate_endpoints"] == 2
    assert attrs["llm_d.epp.scorer.count"] == len(plugins)
    attrs = _attributes(picking)
    assert attrs["llm_d.epp.picker.candidate_endpoints"] == 2
    assert sorted(attrs["llm_d.epp.picker.top_endpoints"]) == ["default/pod-0", "default/pod-1"]
    top = attrs["llm_d.epp.picker.top_scores"]
    assert len(top) == 2 and top == sorted(top, reverse=True)
    assert attrs["gen_ai.request.model"] == "sim-model" and attrs["gen_ai.request.id"]
    assert {svc for svc, s in collector.spans if s.trace_id.hex() == CLIENT_TRACE} == {
        "epp-under-test"
    }

    # The model server got the EPP's request span as its parent, in the client's trace.
    _, trace_id, parent_id, flags = headers["x-sim-saw-traceparent"].split("-")
    assert (trace_id, parent_id, flags) == (CLIENT_TRACE, root.span_id.hex(), "01")


async def test_a_refused_request_ends_its_span_with_the_error_when_traced(
    collector: Collector, start_app: Any, envoy: Any
) -> None:
    app = await start_app([])  # no endpoints: 503
    proxy = envoy(app)
    trace_id = "5" * 32
    parent = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
    status, _, _ = await post(f"{proxy.url}/v1/completions", COMPLETION, parent)
    assert status == 503
    spans = _by_name(await collector.wait_for("gateway.request", trace_id))
    (root,) = spans["gateway.request"]
    (orchestration,) = spans["gateway.request_orchestration"]
    assert root.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert orchestration.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert "candidates" in orchestration.status.message


async def test_disaggregation_spans_carry_pd_and_mm_attributes_when_traced(
    collector: Collector, start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(2)
    config = """\
        plugins:
        - type: prefill-filter
        - type: decode-filter
        - type: max-score-picker
        - type: always-disagg-pd-decider
        - type: disagg-profile-handler
          parameters: {deciders: {prefill: always-disagg-pd-decider}}
        schedulingProfiles:
        - name: prefill
          plugins: [{pluginRef: prefill-filter}, {pluginRef: max-score-picker}]
        - name: decode
          plugins: [{pluginRef: decode-filter}, {pluginRef: max-score-picker}]
        """
    roles = {0: {"llm-d.ai/role": "prefill"}, 1: {"llm-d.ai/role": "decode"}}
    app = await start_app(fleet.ports, config, labels=roles)
    proxy = envoy(app)
    trace_id = "6" * 32
    parent = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat = {
        "model": "sim-model",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image, image]}],
    }
    status, headers, body = await post(f"{proxy.url}/v1/chat/completions", chat, parent)
    assert status == 200, body[:300]
    assert headers.get("x-sim-saw-prefiller") == f"127.0.0.1:{fleet.ports[0]}"
    spans = _by_name(await collector.wait_for("prepare_disaggregation", trace_id))
    (prepare,) = spans["prepare_disaggregation"]
    attrs = _attributes(prepare)
    assert attrs["llm_d.epp.pd.disaggregation_used"] is True
    assert attrs["llm_d.epp.pd.prefill_pod_address"] == "127.0.0.1"
    assert attrs["llm_d.epp.pd.prefill_pod_port"] == str(fleet.ports[0])
    assert attrs["llm_d.epp.encode.disaggregation_used"] is False
    assert attrs["llm_d.epp.encode.reason"] == "no_encode_profile_result"
    assert (attrs["mm.modality"], attrs["mm.hash_count"]) == ("image", 2)
    assert {s.name for s in spans["run_scheduler_profile"]} == {"run_scheduler_profile"}
    assert len(spans["pick_endpoints"]) == 2  # one per profile run
    picks = [_attributes(s) for s in spans["pick_disagg_profile"]]
    decisions = [p["llm_d.epp.profile_handler.decision"] for p in picks]
    assert sorted(decisions) == ["complete", "run_decode", "run_prefill"]
    assert all(p["mm.modality"] == "image" for p in picks)
