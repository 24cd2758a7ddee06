"""SGLang's native ``POST /generate``, streamed (SSE) or not.

Request: ``input_ids`` (an array of token ids) or ``text``; ``sampling_params.max_new_tokens``
(default 128, as SGLang's); ``stream``. The answer::

    {"text": ..., "output_ids": [...], "meta_info": {"id": ..., "finish_reason":
     {"type": "length", "length": N} | {"type": "stop", "matched": <id>}, "prompt_tokens": ...,
     "completion_tokens": ..., "cached_tokens": ...}}

A stream sends one such object per token, as ``data: {json}\\n\\n``, with the running text,
ids and counts and ``finish_reason`` null until the last one, then ``data: [DONE]``.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from aiohttp import web

from epp_tools.sim.engine import RequestRejected, TokenEvent
from epp_tools.sim.inference import RUNTIME, error_response, json_response, read_json
from epp_tools.sim.openai import ApiError
from epp_tools.sim.tokenizer import detokenize, tokenize

DEFAULT_MAX_NEW_TOKENS = 128


def _prompt(body: dict[str, Any]) -> list[int]:
    ids = body.get("input_ids")
    if ids is not None:
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise ApiError(400, "input_ids must be a non-empty list of token ids", "input_ids")
        return ids
    text = body.get("text")
    if isinstance(text, str) and text:
        return tokenize(text)
    raise ApiError(400, "either text or input_ids should be provided", "input_ids")


def _limit(body: dict[str, Any]) -> int:
    params = body.get("sampling_params")
    value = params.get("max_new_tokens") if isinstance(params, dict) else None
    if value is None:
        return DEFAULT_MAX_NEW_TOKENS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ApiError(400, "max_new_tokens must be a positive integer", "max_new_tokens")
    return value


def _answer(rid: str, ids: list[int], last: TokenEvent, done: bool) -> dict[str, Any]:
    reason: dict[str, Any] | None = None
    if done:
        if last.finish_reason == "stop":
            reason = {"type": "stop", "matched": last.token_id}
        else:
            reason = {"type": "length", "length": len(ids)}
    meta = {
        "id": rid,
        "finish_reason": reason,
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": len(ids),
        "cached_tokens": last.cached_tokens,
    }
    return {"text": detokenize(ids), "output_ids": ids, "meta_info": meta}


async def handle_generate(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    try:
        body = await read_json(request)
        prompt, limit = _prompt(body), _limit(body)
    except ApiError as err:
        runtime.counters.requests_failed += 1
        return error_response(err)
    rid = uuid.uuid4().hex
    try:
        channel = runtime.submit(rid, prompt, limit, None)
    except RequestRejected as exc:
        runtime.counters.requests_failed += 1
        return error_response(ApiError(400, str(exc)))
    response: web.StreamResponse | None = None
    try:
        if body.get("stream") is True:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
        ids: list[int] = []
        for _ in range(limit):
            event = await channel.get()
            ids.append(event.token_id)
            if response is not None:
                data = orjson.dumps(_answer(rid, ids, event, event.finished))
                await response.write(b"data: " + data + b"\n\n")
            if event.finished:
                break
        runtime.counters.requests_served += 1
        if response is None:
            return json_response(_answer(rid, ids, event, True))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    except ConnectionResetError:
        runtime.counters.requests_failed += 1
        return response or web.Response(status=500)
    finally:
        runtime.abort(rid)
