"""HTTP handlers of the generation endpoints: ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/responses`` (streaming and not), with fault injection.

A request is tokenized, queued on the pod's engine and answered from the engine's token events;
if the client goes away the request is aborted so its KV blocks are released. Before that the
pod's role and the P/D headers decide how it is served (``epp_tools.sim.disagg``): as a prefill leg,
as a decode leg after a remote prefill, or in full.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from epp_tools.sim import disagg
from epp_tools.sim.engine import RequestRejected, TokenEvent
from epp_tools.sim.openai import ApiError, Parsed, parse_chat, parse_completion, parse_responses
from epp_tools.sim.runtime import PodRuntime
from epp_tools.sim.tokenizer import detokenize
from epp_tools.sim.wire import DONE, Format, ResponsesFormat, formatter

_BLACK_HOLE_LIMIT_S = 60.0  # a black-holed request is answered at the latest after this long

RUNTIME = web.AppKey("runtime", PodRuntime)
PORT = web.AppKey("port", int)
BODY_SHA256 = web.RequestKey("sim_body_sha256", str)  # hex SHA-256 of the raw body
PREFILL_POD = web.RequestKey("sim_prefill_pod", str)  # the pod that computed the prompt


class _CutStream(Exception):
    """The injected ``die_mid_stream_after_chunks`` limit was reached."""


def error_response(error: ApiError) -> web.Response:
    return web.Response(
        status=error.status, body=orjson.dumps(error.body()), content_type="application/json"
    )


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


async def read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    # lets proxy tests check that the body arrived byte-identical (echoed as a header)
    request[BODY_SHA256] = hashlib.sha256(raw).hexdigest()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object")
    return body


def resolve_model(runtime: PodRuntime, model: str) -> str | None:
    """The LoRA adapter a model name selects (None = base model); unknown names are 404."""
    cfg = runtime.config
    if model == cfg.model:
        return None
    if model in cfg.lora_adapters:
        return model
    raise ApiError(404, f"The model `{model}` does not exist.", "model")


def _drop_connection(request: web.Request) -> web.Response:
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)  # never reaches the client: the socket is gone


async def _faults(request: web.Request, runtime: PodRuntime) -> web.Response | None:
    faults = runtime.faults
    if faults.black_hole:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runtime.faults_cleared.wait(), _BLACK_HOLE_LIMIT_S)
        faults = runtime.faults
    if faults.slow_ms:
        await asyncio.sleep(faults.slow_ms / 1000.0)
    if faults.drop_connection_rate and runtime.rng.random() < faults.drop_connection_rate:
        runtime.counters.dropped_connections += 1
        return _drop_connection(request)
    if faults.error_rate and runtime.rng.random() < faults.error_rate:
        runtime.counters.injected_errors += 1
        return error_response(ApiError(faults.error_status, "injected fault (sim)"))
    return None


def _parse(runtime: PodRuntime, path_kind: str, body: dict[str, Any]) -> Parsed:
    if path_kind == "completion":
        return parse_completion(body, runtime.config.bos_token_id)
    if path_kind == "chat":
        return parse_chat(body)
    previous = None
    prev_id = body.get("previous_response_id")
    if prev_id is not None:
        if not isinstance(prev_id, str):
            raise ApiError(400, "previous_response_id must be a string", "previous_response_id")
        previous = runtime.recall_response(prev_id)
        if previous is None:
            raise ApiError(404, f"Response with id '{prev_id}' not found.", "previous_response_id")
    return parse_responses(body, previous)


async def handle_generate(request: web.Request, path_kind: str) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    try:
        body = await read_json(request)
        parsed = _parse(runtime, path_kind, body)
        lora = resolve_model(runtime, parsed.model)
    except ApiError as err:
        runtime.counters.requests_failed += 1
        return error_response(err)
    injected = await _faults(request, runtime)
    if injected is not None:
        return injected
    plan = await disagg.plan(request, runtime, path_kind, body, parsed)
    if isinstance(plan, web.Response):
        return plan
    parsed = plan.parsed
    request[PREFILL_POD] = plan.prefill_pod
    fmt = formatter(parsed)
    if plan.leg and not parsed.stream:
        prompt = len(parsed.prompts[0])
        fmt.kv_transfer_params = disagg.leg_answer_params(runtime.config, request.app[PORT], prompt)
    try:
        channels = [
            (
                f"{fmt.id}-{i}",
                runtime.submit(f"{fmt.id}-{i}", ids, parsed.max_tokens, lora, plan.remote),
            )
            for i, ids in enumerate(parsed.prompts)
        ]
    except RequestRejected as exc:
        runtime.counters.requests_failed += 1
        return error_response(ApiError(400, str(exc)))
    try:
        if parsed.stream:
            return await _stream(request, runtime, fmt, channels[0][1])
        return await _complete(runtime, fmt, [ch for _, ch in channels])
    finally:
        for request_id, _ in channels:
            runtime.abort(request_id)


@dataclass
class _Result:
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int


async def _collect(channel: asyncio.Queue[TokenEvent], limit: int) -> _Result:
    tokens: list[int] = []
    for _ in range(limit + 1):
        event = await channel.get()
        tokens.append(event.token_id)
        if event.finished:
            reason = event.finish_reason or "length"
            return _Result(tokens, reason, event.prompt_tokens, event.cached_tokens)
    raise RuntimeError("engine produced more tokens than requested")


async def _complete(
    runtime: PodRuntime, fmt: Format, channels: list[asyncio.Queue[TokenEvent]]
) -> web.Response:
    limit = fmt.parsed.max_tokens or runtime.config.default_max_tokens
    results = [await _collect(ch, limit) for ch in channels]
    fmt.prompt_tokens = sum(r.prompt_tokens for r in results)
    fmt.cached_tokens = sum(r.cached_tokens for r in results)
    fmt.generated = sum(len(r.token_ids) for r in results)
    texts = [detokenize(r.token_ids) for r in results]
    body = fmt.full(texts, [r.finish_reason for r in results])
    _remember(runtime, fmt, texts[0])
    runtime.counters.requests_served += 1
    return json_response(body)


def _remember(runtime: PodRuntime, fmt: Format, text: str) -> None:
    if isinstance(fmt, ResponsesFormat) and fmt.parsed.store:
        turn = [*fmt.parsed.messages, {"role": "assistant", "content": text}]
        runtime.remember_response(fmt.id, turn)


class _ChunkWriter:
    def __init__(self, response: web.StreamResponse, cut_after: int | None) -> None:
        self.response = response
        self.remaining = cut_after

    async def send(self, chunks: list[bytes]) -> None:
        if self.remaining is not None:
            if len(chunks) >= self.remaining:
                if self.remaining:
                    await self.response.write(b"".join(chunks[: self.remaining]))
                raise _CutStream
            self.remaining -= len(chunks)
        if chunks:
            await self.response.write(b"".join(chunks))


async def _stream(
    request: web.Request,
    runtime: PodRuntime,
    fmt: Format,
    channel: asyncio.Queue[TokenEvent],
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    writer = _ChunkWriter(response, runtime.faults.die_mid_stream_after_chunks)
    limit = fmt.parsed.max_tokens or runtime.config.default_max_tokens
    try:
        opening = fmt.start()
        if not fmt.start_with_first_token:
            await writer.send(opening)
            opening = []
        for _ in range(limit):
            chunks, finished = _drain(fmt, await channel.get(), channel)
            await writer.send(opening + chunks)
            opening = []
            if finished:
                break
        tail = fmt.finish() + ([DONE] if fmt.done_marker else [])
        await writer.send(tail)
        if isinstance(fmt, ResponsesFormat):
            _remember(runtime, fmt, "".join(fmt.text_parts))
        await response.write_eof()
        runtime.counters.requests_served += 1
    except _CutStream:
        runtime.counters.streams_cut += 1
        if request.transport is not None:
            request.transport.abort()
    except ConnectionResetError:
        runtime.counters.requests_failed += 1
    return response


def _drain(
    fmt: Format, first: TokenEvent, channel: asyncio.Queue[TokenEvent]
) -> tuple[list[bytes], bool]:
    """Chunks for ``first`` and every event already queued (one socket write per burst)."""
    chunks: list[bytes] = []
    event: TokenEvent | None = first
    while event is not None:
        fmt.prompt_tokens, fmt.cached_tokens = event.prompt_tokens, event.cached_tokens
        fmt.generated = event.index + 1
        chunks += fmt.token(detokenize([event.token_id]), event.finish_reason)
        if event.finished:
            return chunks, True
        event = channel.get_nowait() if not channel.empty() else None
    return chunks, False
