"""The aiohttp application of one simulated pod.

Routes (vLLM-compatible unless noted):

* ``POST /v1/completions``, ``/v1/chat/completions``, ``/v1/responses`` — generation;
* ``POST /v1/completions/render`` (list of token-in requests, one per prompt) and
  ``/v1/chat/completions/render`` (one token-in request): ``{"request_id", "token_ids",
  "sampling_params", "model", "stream", "stream_options", "cache_salt", "token_offsets"}`` as
  vLLM's render endpoints answer; ``POST /tokenize`` (``{"count", "max_model_len", "tokens"}``);
* ``GET /v1/models``, ``/health``, ``/ping``, ``/version``, ``/metrics``;
  ``POST /reset_prefix_cache`` (emits ``AllBlocksCleared``; 409 while blocks are in use);
* SGLang-shaped ``GET /server_info``, ``/model_info``, ``/get_model_info``, and SGLang's native
  ``POST /generate`` (``epp_tools.sim.sglang``);
* on the same port, gRPC over h2c (``epp_tools.sim.grpcserver``): vLLM's
  ``vllm.grpc.engine.VllmEngine`` ``Generate``/``Embed`` and Vertex AI's ``PredictionService``
  ``ChatCompletions``/``RawPredict``/``StreamRawPredict`` (``epp_tools.sim.grpcapi``);
* simulator control (ours): ``GET|POST /sim/overrides``, ``GET|POST /sim/faults``,
  ``GET /sim/stats``.

Every response carries ``x-sim-pod: <pod name>`` and ``x-sim-role: both|prefill|decode``; a
generation answer also ``x-sim-prefill-pod``, the pod that computed its prompt (P/D, see
``epp_tools.sim.disagg``). Diagnostics for proxy tests: a response to a request with a JSON body
carries ``x-sim-request-sha256`` (hex SHA-256 of the body bytes as received), and a request that
arrived with ``x-prefiller-host-port`` or ``x-data-parallel-host-port`` gets its value back as
``x-sim-saw-prefiller`` or ``x-sim-saw-data-parallel``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from epp_tools.sim.control import Faults, Overrides
from epp_tools.sim.inference import (
    BODY_SHA256,
    PORT,
    PREFILL_POD,
    RUNTIME,
    error_response,
    handle_generate,
    json_response,
    read_json,
    resolve_model,
)
from epp_tools.sim.openai import ApiError, Parsed, parse_chat, parse_completion
from epp_tools.sim.runtime import PodRuntime
from epp_tools.sim.sglang import handle_generate as sglang_generate

_STALL_LIMIT_S = 60.0  # a stalled /metrics answers at the latest after this long
_GARBAGE = b"\x00\xff{not: metrics}\nvllm:num_requests_waiting{ one two\n\x1b[2J" * 64
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SIM_VERSION = "0.32.0+sim"


def _generate(kind: str) -> _Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await handle_generate(request, kind)

    return handler


def _render_item(parsed: Parsed, body: dict[str, Any], ids: Sequence[int], prefix: str) -> Any:
    return {
        "request_id": f"{prefix}-{uuid.uuid4().hex}",
        "token_ids": list(ids),
        "sampling_params": {"max_tokens": parsed.max_tokens},
        "model": parsed.model,
        "stream": body.get("stream") is True,
        "stream_options": body.get("stream_options"),
        "cache_salt": body.get("cache_salt"),
        "token_offsets": None,
    }


def _render(kind: str) -> _Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        runtime = request.app[RUNTIME]
        try:
            body = await read_json(request)
            body_no_stream = {**body, "stream": False}  # render never streams
            bos = runtime.config.bos_token_id
            parsed = (
                parse_completion(body_no_stream, bos) if kind == "completion" else parse_chat(body)
            )
            resolve_model(runtime, parsed.model)
        except ApiError as err:
            return error_response(err)
        if kind == "completion":
            items = [_render_item(parsed, body, ids, "cmpl") for ids in parsed.prompts]
            return json_response(items)
        return json_response(_render_item(parsed, body, parsed.prompts[0], "chatcmpl"))

    return handler


async def _tokenize(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    try:
        body = await read_json(request)
        bos = runtime.config.bos_token_id
        parsed = parse_chat(body) if "messages" in body else parse_completion(body, bos)
        resolve_model(runtime, parsed.model)
    except ApiError as err:
        return error_response(err)
    ids = list(parsed.prompts[0])
    return json_response(
        {"count": len(ids), "max_model_len": runtime.config.max_model_len, "tokens": ids}
    )


async def _models(request: web.Request) -> web.StreamResponse:
    cfg = request.app[RUNTIME].config
    created = int(time.time())

    def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": cfg.max_model_len,
            "permission": [],
        }

    data = [card(cfg.model, cfg.model, None)]
    data += [card(name, f"/adapters/{name}", cfg.model) for name in cfg.lora_adapters]
    return json_response({"object": "list", "data": data})


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.StreamResponse:
    return json_response({"version": SIM_VERSION})


async def _metrics(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    runtime.counters.metrics_scrapes += 1
    faults = runtime.faults
    delay_ms = faults.slow_ms + faults.metrics_delay_ms
    if delay_ms:
        await asyncio.sleep(delay_ms / 1000.0)
    if faults.holds_requests:
        runtime.counters.stalled_scrapes += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runtime.faults_cleared.wait(), _STALL_LIMIT_S)
    if faults.metrics_status:
        return web.Response(status=faults.metrics_status)
    if faults.metrics_garbage:
        return web.Response(body=_GARBAGE, headers={"Content-Type": "text/plain"})
    # the content type prometheus_client serves (text format 0.0.4)
    return web.Response(
        body=runtime.metrics_page(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )


async def _reset_prefix_cache(request: web.Request) -> web.StreamResponse:
    if request.app[RUNTIME].reset_prefix_cache():
        return web.Response(status=200)
    return error_response(ApiError(409, "Cannot reset the prefix cache while blocks are in use"))


def _model_info(request: web.Request) -> dict[str, Any]:
    cfg = request.app[RUNTIME].config
    return {
        "model_path": cfg.model,
        "tokenizer_path": cfg.model,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }


async def _get_model_info(request: web.Request) -> web.StreamResponse:
    return json_response(_model_info(request))


async def _server_info(request: web.Request) -> web.StreamResponse:
    runtime = request.app[RUNTIME]
    cfg = runtime.config
    return json_response(
        {
            "model_path": cfg.model,
            "served_model_name": cfg.model,
            "host": cfg.host,
            "port": request.app[PORT],
            "page_size": cfg.block_size,
            "max_running_requests": cfg.max_num_seqs,
            "max_total_num_tokens": cfg.block_size * cfg.num_gpu_blocks,
            "context_length": cfg.max_model_len,
            "max_loras_per_batch": cfg.max_loras,
            "lora_paths": list(cfg.lora_adapters),
            "internal_states": [
                {
                    "num_running_reqs": runtime.engine.num_running,
                    "num_queue_reqs": runtime.engine.num_waiting,
                    "token_usage": runtime.engine.kv_usage,
                }
            ],
            "version": SIM_VERSION,
        }
    )


def _control(attr: str, parse: Callable[[Any], Overrides | Faults]) -> _Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        runtime = request.app[RUNTIME]
        if request.method == "POST":
            try:
                value = parse(await read_json(request))
            except ApiError as err:
                return error_response(err)
            except ValueError as exc:
                return error_response(ApiError(400, str(exc)))
            if isinstance(value, Faults):
                runtime.set_faults(value)
            else:
                runtime.overrides = value
        current: Overrides | Faults = getattr(runtime, attr)
        return json_response(current.as_json())

    return handler


async def _stats(request: web.Request) -> web.StreamResponse:
    return json_response(request.app[RUNTIME].stats_json())


def build_app(runtime: PodRuntime, port: int) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[RUNTIME] = runtime
    app[PORT] = port
    pod, role = runtime.config.name, runtime.config.role
    echoes = (
        ("x-prefiller-host-port", "x-sim-saw-prefiller"),
        ("x-data-parallel-host-port", "x-sim-saw-data-parallel"),
        ("traceparent", "x-sim-saw-traceparent"),
    )

    async def tag(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-sim-pod"] = pod
        response.headers["x-sim-role"] = role
        if BODY_SHA256 in request:
            response.headers["x-sim-request-sha256"] = request[BODY_SHA256]
        if PREFILL_POD in request:
            response.headers["x-sim-prefill-pod"] = request[PREFILL_POD]
        for header, echo in echoes:
            value = request.headers.get(header)
            if value is not None:
                response.headers[echo] = value

    app.on_response_prepare.append(tag)
    r = app.router
    r.add_post("/v1/completions", _generate("completion"))
    r.add_post("/v1/chat/completions", _generate("chat"))
    r.add_post("/v1/responses", _generate("responses"))
    r.add_post("/v1/completions/render", _render("completion"))
    r.add_post("/v1/chat/completions/render", _render("chat"))
    r.add_post("/tokenize", _tokenize)
    r.add_get("/v1/models", _models)
    r.add_get("/health", _health)
    r.add_get("/ping", _health)
    r.add_get("/version", _version)
    r.add_get("/metrics", _metrics)
    r.add_post("/reset_prefix_cache", _reset_prefix_cache)
    r.add_post("/generate", sglang_generate)
    r.add_get("/server_info", _server_info)
    r.add_get("/get_server_info", _server_info)
    r.add_get("/model_info", _get_model_info)
    r.add_get("/get_model_info", _get_model_info)
    for path, attr, parse in (
        ("/sim/overrides", "overrides", Overrides.parse),
        ("/sim/faults", "faults", Faults.parse),
    ):
        r.add_route("GET", path, _control(attr, parse))
        r.add_route("POST", path, _control(attr, parse))
    r.add_get("/sim/stats", _stats)
    return app
