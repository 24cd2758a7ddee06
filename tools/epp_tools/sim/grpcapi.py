"""The simulator's gRPC APIs (served by ``epp_tools.sim.grpcserver`` on each pod's port).

vLLM's engine service, ``/vllm.grpc.engine.VllmEngine/...`` (vLLM's field numbers):

* ``Generate``: ``GenerateRequest`` (``tokenized.input_ids`` or ``text``, ``sampling_params.
  max_tokens``, ``stream``) answered, when streamed, by one ``GenerateResponse.chunk`` per token
  (running ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``) and a last
  ``GenerateResponse.complete``; not streamed, by the ``complete`` alone.
* ``Embed``: ``EmbedRequest`` (``tokenized.input_ids``) answered by an ``EmbedResponse`` of 8
  floats derived from the ids, with ``prompt_tokens``.

Vertex AI's ``/google.cloud.aiplatform.{v1,v1beta1}.PredictionService/...``: ``ChatCompletions``
(an OpenAI chat request in ``http_body.data``), ``RawPredict`` and ``StreamRawPredict`` (a
Responses API request). Each answers with ``google.api.HttpBody`` messages: the JSON answer
(``application/json``), or, for a request with ``"stream": true``, one message of server-sent
events per token, as the OpenAI endpoints stream them (``text/event-stream``).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson

from epp_tools.sim import protowire as pw
from epp_tools.sim.engine import RequestRejected, TokenEvent
from epp_tools.sim.grpcserver import GrpcError, Handler, Send
from epp_tools.sim.inference import resolve_model
from epp_tools.sim.openai import ApiError, Parsed, parse_chat, parse_responses
from epp_tools.sim.runtime import PodRuntime
from epp_tools.sim.tokenizer import detokenize, tokenize
from epp_tools.sim.wire import DONE, formatter

VLLM_SERVICE = "/vllm.grpc.engine.VllmEngine"
VERTEX_SERVICES = tuple(
    f"/google.cloud.aiplatform.{v}.PredictionService" for v in ("v1", "v1beta1")
)
EMBEDDING_DIM = 8
_INVALID_ARGUMENT, _NOT_FOUND = 3, 5


def _fields(message: bytes) -> pw.Fields:
    try:
        return pw.decode(message)
    except ValueError as exc:
        raise GrpcError(_INVALID_ARGUMENT, f"malformed request: {exc}") from None


def _message(value: int | bytes) -> pw.Fields:
    return _fields(value) if isinstance(value, bytes) else {}


async def _tokens(
    runtime: PodRuntime, ids: Sequence[int], limit: int, lora: str | None = None
) -> AsyncIterator[TokenEvent]:
    rid = uuid.uuid4().hex
    try:
        channel = runtime.submit(rid, ids, limit, lora)
    except RequestRejected as exc:
        raise GrpcError(_INVALID_ARGUMENT, str(exc)) from None
    try:
        for _ in range(limit):
            event = await channel.get()
            yield event
            if event.finished:
                return
    finally:
        runtime.abort(rid)


def _counts(event: TokenEvent, numbers: tuple[int, int, int]) -> bytes:
    prompt, completion, cached = numbers
    return (
        pw.field_varint(prompt, event.prompt_tokens)
        + pw.field_varint(completion, event.index + 1)
        + pw.field_varint(cached, event.cached_tokens)
    )


def _generate_input(request: pw.Fields) -> list[int]:
    if 2 in request:
        ids = pw.uint32s(_message(pw.first(request, 2)).get(2, []))
    elif 3 in request:
        text = pw.first(request, 3)
        ids = tokenize(text.decode() if isinstance(text, bytes) else "")
    else:
        raise GrpcError(_INVALID_ARGUMENT, "GenerateRequest has no input")
    if not ids:
        raise GrpcError(_INVALID_ARGUMENT, "the prompt is empty")
    return ids


async def vllm_generate(runtime: PodRuntime, message: bytes, send: Send) -> None:
    request = _fields(message)
    ids = _generate_input(request)
    cap = pw.first(_message(pw.first(request, 4)), 8, 0)
    limit = cap if isinstance(cap, int) and cap > 0 else runtime.config.default_max_tokens
    stream = pw.first(request, 5, 0) == 1
    output: list[int] = []
    last: TokenEvent | None = None
    async for event in _tokens(runtime, ids, limit):
        output.append(event.token_id)
        last = event
        if stream:
            chunk = pw.field_packed_varints(1, [event.token_id]) + _counts(event, (2, 3, 4))
            await send(pw.field_bytes(1, chunk))
    assert last is not None
    complete = (
        pw.field_packed_varints(1, output)
        + pw.field_bytes(2, (last.finish_reason or "length").encode())
        + _counts(last, (3, 4, 5))
    )
    await send(pw.field_bytes(2, complete))
    runtime.counters.requests_served += 1


async def vllm_embed(runtime: PodRuntime, message: bytes, send: Send) -> None:
    request = _fields(message)
    ids = pw.uint32s(_message(pw.first(request, 2)).get(2, []))
    if not ids:
        raise GrpcError(_INVALID_ARGUMENT, "EmbedRequest has no tokenized input")
    seed = sum(ids) % 1000
    vector = [((seed + i * 37) % 200 - 100) / 100.0 for i in range(EMBEDDING_DIM)]
    answer = (
        pw.field_packed_floats(1, vector)
        + pw.field_varint(2, len(ids))
        + pw.field_varint(3, EMBEDDING_DIM)
    )
    await send(answer)
    runtime.counters.requests_served += 1


def http_body(content_type: str, data: bytes) -> bytes:
    return pw.field_bytes(1, content_type.encode()) + pw.field_bytes(2, data)


def _vertex_json(message: bytes) -> dict[str, Any]:
    body = _message(pw.first(_fields(message), 2))
    data = pw.first(body, 2)
    try:
        decoded = orjson.loads(data if isinstance(data, bytes) else b"")
    except orjson.JSONDecodeError as exc:
        raise GrpcError(_INVALID_ARGUMENT, f"http_body is not JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise GrpcError(_INVALID_ARGUMENT, "http_body must hold a JSON object")
    return decoded


async def _openai(runtime: PodRuntime, parsed: Parsed, send: Send) -> None:
    try:
        lora = resolve_model(runtime, parsed.model)
    except ApiError as err:
        raise GrpcError(_NOT_FOUND, err.message) from None
    fmt = formatter(parsed)
    limit = parsed.max_tokens or runtime.config.default_max_tokens
    opening, output, last = fmt.start(), [], None
    async for event in _tokens(runtime, parsed.prompts[0], limit, lora):
        output.append(event.token_id)
        last = event
        fmt.prompt_tokens, fmt.cached_tokens = event.prompt_tokens, event.cached_tokens
        fmt.generated = event.index + 1
        chunks = fmt.token(detokenize([event.token_id]), event.finish_reason)
        if parsed.stream:
            await send(http_body("text/event-stream", b"".join(opening + chunks)))
            opening = []
    if parsed.stream:
        tail = fmt.finish() + ([DONE] if fmt.done_marker else [])
        await send(http_body("text/event-stream", b"".join(tail)))
    else:
        reason = (last.finish_reason if last else None) or "length"
        answer = fmt.full([detokenize(output)], [reason])
        await send(http_body("application/json", orjson.dumps(answer)))
    runtime.counters.requests_served += 1


def _openai_request(parse: Callable[[dict[str, Any]], Parsed]) -> Callable[..., Awaitable[None]]:
    async def handler(runtime: PodRuntime, message: bytes, send: Send) -> None:
        try:
            parsed = parse(_vertex_json(message))
        except ApiError as err:
            raise GrpcError(_INVALID_ARGUMENT, err.message) from None
        await _openai(runtime, parsed, send)

    return handler


vertex_chat = _openai_request(parse_chat)
vertex_raw_predict = _openai_request(lambda body: parse_responses(body, None))


def handlers(runtime: PodRuntime) -> dict[str, Handler]:
    """Every gRPC method of a pod, by path."""
    methods: dict[str, Callable[[PodRuntime, bytes, Send], Awaitable[None]]] = {
        f"{VLLM_SERVICE}/Generate": vllm_generate,
        f"{VLLM_SERVICE}/Embed": vllm_embed,
    }
    for service in VERTEX_SERVICES:
        methods[f"{service}/ChatCompletions"] = vertex_chat
        methods[f"{service}/RawPredict"] = vertex_raw_predict
        methods[f"{service}/StreamRawPredict"] = vertex_raw_predict

    def bind(method: Callable[[PodRuntime, bytes, Send], Awaitable[None]]) -> Handler:
        async def handle(message: bytes, send: Send) -> None:
            await method(runtime, message, send)

        return handle

    return {path: bind(method) for path, method in methods.items()}


def unpack_floats(data: bytes) -> list[float]:
    """A packed repeated float field's values (for clients of ``Embed``)."""
    return [v for (v,) in struct.iter_unpack("<f", data)]
