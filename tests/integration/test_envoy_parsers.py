"""The parsers of non-OpenAI APIs end to end: a client through a real Envoy (full duplex, as
`epp envoy-config` generates) to simulated pods, the EPP picking the pod: SGLang's ``/generate``
over HTTP/1.1, vLLM's gRPC engine and Vertex AI's PredictionService over h2c
(``--app-protocol h2c``). Each request must reach the pod the EPP prefers, and the token counts
the pod reported must be what the EPP records."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import grpc
import pytest

from epp._proto import epp_vertexai_v1_pb2 as vertex
from epp._proto import epp_vllmgrpc_v1_pb2 as vllm
from tests.conftest import metrics_text, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]

WAITING = (5, 0)  # pod-1 has the shorter queue: the queue scorer sends everything there


def config(parser: str) -> str:
    return f"""\
plugins:
- type: {parser}
- type: queue-scorer
requestHandler:
  parsers:
  - pluginRef: {parser}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


async def started(start_app: Any, sim_pods: Any, envoy: Any, parser: str, **kw: Any) -> Any:
    fleet = await sim_pods(2)
    for url, waiting in zip(fleet.urls, WAITING, strict=True):
        await set_overrides(url, num_requests_waiting=waiting)
    app = await start_app(fleet.ports, config(parser))
    await settle(app, lambda m: all(x is not None for x in m.values()))
    await settle(app, lambda m: m[fleet.ports[0]].waiting_queue_size == WAITING[0])
    return app, envoy(app, **kw)


def _sum(text: str, family: str, suffix: str) -> float:
    found = re.findall(rf"^{family}_{suffix}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


async def recorded(app: Any, requests: int) -> dict[str, float]:
    """The token sums the EPP recorded once ``requests`` responses are complete."""
    family = "llm_d_epp_request_input_tokens"
    async with asyncio.timeout(15):  # a response is recorded when its ext_proc stream ends
        while _sum(text := await metrics_text(app), family, "count") < requests:
            await asyncio.sleep(0.05)
    return {
        kind: _sum(text, f"llm_d_epp_request_{kind}_tokens", "sum")
        for kind in ("input", "output", "cached")
    }


async def test_sglang_generate_routed_and_usage_recorded(start_app, sim_pods, envoy) -> None:
    app, proxy = await started(start_app, sim_pods, envoy, "sglanghttp-parser")
    body = {"input_ids": list(range(1, 41)), "sampling_params": {"max_new_tokens": 5}}
    status, headers, raw = await post(f"{proxy.url}/generate", body)
    assert status == 200, raw
    assert headers["x-sim-pod"] == "pod-1"
    meta = json.loads(raw)["meta_info"]
    status, headers, raw = await post(f"{proxy.url}/generate", {**body, "stream": True})
    assert (status, headers["x-sim-pod"]) == (200, "pod-1")
    assert raw.endswith(b"data: [DONE]\n\n")
    got = await recorded(app, 2)
    assert (got["input"], got["output"]) == (80, 10)
    assert got["cached"] >= meta["cached_tokens"]  # the second request hit the first's blocks
    status, _, raw = await post(f"{proxy.url}/generate", {"text": "no token ids"})
    assert status == 400
    assert raw.startswith(b"inference error: BadRequest - invalid generate request: must have")


async def grpc_call(url: str, path: str, request: bytes) -> tuple[dict[str, str], list[bytes]]:
    target = url.removeprefix("http://")
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_stream(path)(request, timeout=30)
        headers = {k: str(v) for k, v in await call.initial_metadata()}
        return headers, [m async for m in call]


async def test_vllm_grpc_generate_and_embed_routed_and_usage_recorded(
    start_app, sim_pods, envoy
) -> None:
    app, proxy = await started(start_app, sim_pods, envoy, "vllmgrpc-parser", app_protocol="h2c")
    generated = []
    for stream in (False, True):
        request = vllm.GenerateRequest(
            request_id=f"r{stream}",
            tokenized=vllm.TokenizedInput(input_ids=list(range(100, 130))),
            sampling_params=vllm.SamplingParams(max_tokens=4),
            stream=stream,
        )
        path = "/vllm.grpc.engine.VllmEngine/Generate"
        headers, answers = await grpc_call(proxy.url, path, request.SerializeToString())
        assert headers["x-sim-pod"] == "pod-1"
        last = vllm.GenerateResponse.FromString(answers[-1]).complete
        generated.append(last)
        assert len(answers) == (5 if stream else 1)
    embed = vllm.EmbedRequest(tokenized=vllm.TokenizedInput(input_ids=[1, 2, 3]))
    path = "/vllm.grpc.engine.VllmEngine/Embed"
    headers, (answer,) = await grpc_call(proxy.url, path, embed.SerializeToString())
    assert headers["x-sim-pod"] == "pod-1"
    assert vllm.EmbedResponse.FromString(answer).prompt_tokens == 3
    got = await recorded(app, 3)
    assert (got["input"], got["output"]) == (30 + 30 + 3, 4 + 4)
    assert got["cached"] == sum(g.cached_tokens for g in generated)
    with pytest.raises(grpc.aio.AioRpcError):  # no input: the EPP answers 400
        await grpc_call(proxy.url, path, vllm.EmbedRequest().SerializeToString())


def usages(data: bytes) -> list[dict[str, Any]]:
    """The usage blocks of an OpenAI answer: a JSON body's, or a stream's (chat chunks, the
    Responses API's ``response.completed``)."""
    if data.startswith(b"{"):
        return [json.loads(data)["usage"]]
    out = []
    for line in data.splitlines():
        if line.startswith(b"data: {"):
            event = json.loads(line[6:])
            usage = event.get("usage") or (event.get("response") or {}).get("usage")
            if usage:
                out.append(usage)
    return out


def vertex_request(message: type, payload: dict[str, Any]) -> bytes:
    body = vertex.HttpBody(content_type="application/json", data=json.dumps(payload).encode())
    return message(endpoint="projects/p/endpoints/e", http_body=body).SerializeToString()  # type: ignore[no-any-return]


async def test_vertex_ai_prediction_service_routed_and_usage_recorded(
    start_app, sim_pods, envoy
) -> None:
    app, proxy = await started(start_app, sim_pods, envoy, "vertexai-parser", app_protocol="h2c")
    service = "/google.cloud.aiplatform.v1.PredictionService"
    chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    responses = {"model": "sim-model", "input": "hello", "max_output_tokens": 2, "stream": True}
    calls = [
        (f"{service}/ChatCompletions", vertex.ChatCompletionsRequest, chat),
        (f"{service}/ChatCompletions", vertex.ChatCompletionsRequest, streamed),
        (f"{service}/StreamRawPredict", vertex.StreamRawPredictRequest, responses),
    ]
    prompt = completion = 0
    for path, message, payload in calls:
        headers, answers = await grpc_call(proxy.url, path, vertex_request(message, payload))
        assert headers["x-sim-pod"] == "pod-1", path
        data = b"".join(vertex.HttpBody.FromString(a).data for a in answers)
        for usage in usages(data):
            prompt += usage.get("prompt_tokens", usage.get("input_tokens", 0))
            completion += usage.get("completion_tokens", usage.get("output_tokens", 0))
    got = await recorded(app, 3)
    assert (got["input"], got["output"]) == (prompt, completion) and completion == 3 + 3 + 2
