"""The simulator's SGLang ``/generate`` and its gRPC APIs (vLLM's engine service, Vertex AI's
PredictionService) over h2c on the same port as its HTTP/1.1 API. The gRPC messages are built and
read with the EPP's generated schemas, which checks the simulator's hand-written wire format."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from epp._proto import epp_vertexai_v1_pb2 as vertex
from epp._proto import epp_vllmgrpc_v1_pb2 as vllm
from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

pytestmark = pytest.mark.both_loops  # uvloop and asyncio (conftest.py)

MODEL = "sim-model"


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with SimFleet([PodConfig(name="pod-a", model=MODEL, time_scale=200.0)]) as f:
        yield f


async def call(fleet: SimFleet, path: str, request: bytes) -> list[bytes]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{fleet.ports[0]}") as channel:
        method = channel.unary_stream(path)
        return [m async for m in method(request, timeout=30)]


async def test_sglang_generate_answers_with_meta_info(fleet: SimFleet) -> None:
    body = {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 3}}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[0]}/generate", json=body) as r:
            assert r.status == 200
            answer = await r.json()
        async with s.post(f"{fleet.urls[0]}/generate", json={**body, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            text = await r.text()
    meta = answer["meta_info"]
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (4, 3)
    assert meta["finish_reason"] == {"type": "length", "length": 3}
    assert len(answer["output_ids"]) == 3
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert [e["meta_info"]["finish_reason"] is None for e in events] == [True, True, False]
    assert events[-1]["meta_info"]["completion_tokens"] == 3
    assert text.endswith("data: [DONE]\n\n")


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_generate_streams_chunks_then_complete(fleet: SimFleet, stream: bool) -> None:
    request = vllm.GenerateRequest(
        request_id="r",
        tokenized=vllm.TokenizedInput(input_ids=[5, 6, 7]),
        sampling_params=vllm.SamplingParams(max_tokens=4),
        stream=stream,
    )
    answers = await call(
        fleet, "/vllm.grpc.engine.VllmEngine/Generate", request.SerializeToString()
    )
    messages = [vllm.GenerateResponse.FromString(a) for a in answers]
    assert [m.WhichOneof("response") for m in messages] == ["chunk"] * (4 if stream else 0) + [
        "complete"
    ]
    done = messages[-1].complete
    assert (done.prompt_tokens, done.completion_tokens, len(done.output_ids)) == (3, 4, 4)
    assert done.finish_reason == "length"


async def test_vllm_generate_text_and_embed(fleet: SimFleet) -> None:
    request = vllm.GenerateRequest(text="hello there, simulator", stream=False)
    (answer,) = await call(
        fleet, "/vllm.grpc.engine.VllmEngine/Generate", request.SerializeToString()
    )
    assert vllm.GenerateResponse.FromString(answer).complete.prompt_tokens > 0
    embed = vllm.EmbedRequest(tokenized=vllm.TokenizedInput(input_ids=[1, 2]))
    (answer,) = await call(fleet, "/vllm.grpc.engine.VllmEngine/Embed", embed.SerializeToString())
    parsed = vllm.EmbedResponse.FromString(answer)
    assert (parsed.prompt_tokens, parsed.embedding_dim, len(parsed.embedding)) == (2, 8, 8)


async def test_unknown_method_is_unimplemented(fleet: SimFleet) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(fleet, "/vllm.grpc.engine.VllmEngine/HealthCheck", b"")
    assert info.value.code() is grpc.StatusCode.UNIMPLEMENTED


def vertex_request(message: type, payload: dict[str, Any]) -> bytes:
    body = vertex.HttpBody(content_type="application/json", data=json.dumps(payload).encode())
    return message(endpoint="e", http_body=body).SerializeToString()  # type: ignore[no-any-return]


async def test_vertex_chat_completions_json_and_stream(fleet: SimFleet) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    path = "/google.cloud.aiplatform.v1.PredictionService/ChatCompletions"
    (answer,) = await call(fleet, path, vertex_request(vertex.ChatCompletionsRequest, chat))
    body = vertex.HttpBody.FromString(answer)
    assert body.content_type == "application/json"
    assert json.loads(body.data)["usage"]["completion_tokens"] == 3
    streamed = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    answers = await call(fleet, path, vertex_request(vertex.ChatCompletionsRequest, streamed))
    data = b"".join(vertex.HttpBody.FromString(a).data for a in answers)
    assert b'"usage":{"prompt_tokens"' in data and data.endswith(b"data: [DONE]\n\n")


async def test_vertex_raw_predict_answers_a_responses_request(fleet: SimFleet) -> None:
    request = {"model": MODEL, "input": "hello", "max_output_tokens": 2}
    path = "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict"
    (answer,) = await call(fleet, path, vertex_request(vertex.RawPredictRequest, request))
    usage = json.loads(vertex.HttpBody.FromString(answer).data)["usage"]
    assert usage["output_tokens"] == 2
