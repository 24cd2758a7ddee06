"""Disaggregated prefill/decode (P/D) in the simulator: pod roles, the decode pod's sidecar and
the prefill leg.

Roles (``PodConfig.role``; ``epp sim --role`` for every pod, ``--pod-role`` per pod), shown on
every answer as ``x-sim-role`` and in ``/sim/stats``:

* ``both`` (default): aggregated serving. It also acts as a decode pod when a request names a
  prefill pod, and serves prefill legs.
* ``decode``: behaves as ``both``; a request without a prefill pod is prefilled here, as llm-d's
  decode pods do when the decider keeps a request aggregated. The roles differ in the
  ``llm-d.ai/role`` label the EPP's role filters read.
* ``prefill``: serves only prefills: every generation request is answered as a prefill leg, and
  ``x-prefiller-host-port`` is ignored (prefill pods have no sidecar). vLLM itself (NIXL's
  ``kv_both`` role) would decode a request that reaches it in full; the simulator stops after
  the first token, so that a router sending decode traffic to a prefill pod shows: one-token
  answers, counted in ``prefill_legs``.

A prefill leg (role ``prefill``, or a body whose ``kv_transfer_params.do_remote_decode`` is true,
as llm-d's sidecar sends it): the prompt is prefilled and one token generated (``finish_reason``
``length``); a non-streamed answer carries vLLM NIXL's ``kv_transfer_params``
(``do_remote_prefill`` true, ``do_remote_decode`` false, ``remote_block_ids``, ``remote_engine_id``
= the pod name, ``remote_host``, ``remote_port``, ``tp_size`` 1). Its blocks stay in the prefix
cache (vLLM holds them until the decode pod has read them, then frees them into its cache; the
simulator frees them at once).

The sidecar of ``both`` and ``decode`` pods, when a request carries ``x-prefiller-host-port``,
does what llm-d's routing sidecar does with its NIXL v2 connector:

1. takes the header's first value (several headers, or one comma-separated list; trimmed); the
   header is not forwarded;
2. sends the prefill leg, a real HTTP request to ``http://<host:port><same path>``: the client's
   body with ``kv_transfer_params`` ``{do_remote_decode: true, do_remote_prefill: false,
   remote_engine_id, remote_block_ids, remote_host, remote_port: null}``, ``stream`` false, no
   ``stream_options``, ``max_tokens``, ``max_completion_tokens`` and ``min_tokens`` 1 (Responses:
   ``max_output_tokens``) and a new ``x-request-id``; one attempt (the sidecar's default
   ``--prefill-max-retries 0``) of at most ``PREFILL_TIMEOUT_S``;
3. returns a non-2xx answer to the client as it is (an unreachable pod: 502);
4. runs the decode leg here. With the answer's ``kv_transfer_params`` (``do_remote_prefill``
   true) the prompt's KV is pulled (``epp_tools.sim.engine``: ``kv_transfer_ms_per_block`` for each
   block this pod lacks; the pulled blocks are cached here afterwards); without them (a prefill
   server that is not P/D-capable) this pod prefills the prompt itself;
5. reports the prefill pod's ``usage.prompt_tokens_details.cached_tokens`` (chat and
   completions; the sidecar rewrites the usage so; Responses keep this pod's count).

A decode leg sent straight to a pod (``kv_transfer_params.do_remote_prefill`` true in the body,
as llm-d's sidecar sends it to its local vLLM) is served as in step 4, so the simulator also runs
behind the real sidecar.

Every generation answer names in ``x-sim-prefill-pod`` the pod that computed its prompt: this
one, or the prefill pod (its ``x-sim-pod`` header, else its ``host:port``; for a decode leg sent
straight to the pod, the ``remote_engine_id`` of its ``kv_transfer_params``, ``?`` without one).

Not modelled: the sidecar's prefiller sampling and SSRF allow-list, prefill retries, encoders
(``x-encoder-hosts-ports``), connectors other than NIXL v2, data-parallel ranks inside a pod, and
contention between transfers (each runs at full speed).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import orjson
from aiohttp import web

from epp_tools.sim.config import PodConfig
from epp_tools.sim.engine import RemoteKV
from epp_tools.sim.openai import ApiError, Parsed
from epp_tools.sim.runtime import PodRuntime

PREFILLER_HEADER: Final = "x-prefiller-host-port"
PREFILL_TIMEOUT_S: Final = 300.0
"""Wall-clock cap of one prefill leg."""
_RESPONSES_LIMITS: Final = ("max_output_tokens",)
_OPENAI_LIMITS: Final = ("max_tokens", "max_completion_tokens", "min_tokens")
_JSON: Final = {"content-type": "application/json"}
_LEG_PARAMS: Final[Mapping[str, Any]] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True)
class Plan:
    """How this pod serves one generation request."""

    parsed: Parsed
    prefill_pod: str
    """The pod that computes the prompt (``x-sim-prefill-pod``)."""
    remote: RemoteKV | None = None
    """Set when the prompt's KV is pulled from a prefill pod."""
    leg: bool = False
    """A prefill leg: one token, ``kv_transfer_params`` in a non-streamed answer."""


def prefill_target(values: Sequence[str]) -> str:
    """The prefill pod of ``x-prefiller-host-port`` values (``""``: none), as the sidecar reads
    them: one value is split at commas, the first entry wins."""
    entries = values[0].split(",") if len(values) == 1 else list(values)
    return entries[0].strip() if entries else ""


def _kv_params(body: Mapping[str, Any]) -> Mapping[str, Any]:
    params = body.get("kv_transfer_params")
    return params if isinstance(params, Mapping) else {}


def prefill_leg_body(body: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The body of the prefill leg the sidecar sends for ``body``."""
    leg = {k: v for k, v in body.items() if k != "stream_options"}
    leg["kv_transfer_params"] = dict(_LEG_PARAMS)
    leg["stream"] = False
    for field in _RESPONSES_LIMITS if kind == "responses" else _OPENAI_LIMITS:
        leg[field] = 1
    return leg


def leg_answer_params(config: PodConfig, port: int, prompt_tokens: int) -> dict[str, Any]:
    """``kv_transfer_params`` of a prefill leg's answer (vLLM's NIXL connector shape)."""
    blocks = -(-prompt_tokens // config.block_size)
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": config.name,
        "remote_host": config.host,
        "remote_port": port,
        "tp_size": 1,
    }


def cached_tokens(answer: Mapping[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of an answer (0 when absent, as the sidecar
    reads a missing value)."""
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


async def plan(
    request: web.Request, runtime: PodRuntime, kind: str, body: Mapping[str, Any], parsed: Parsed
) -> Plan | web.Response:
    """Decide how to serve a generation request; runs the remote prefill when one is named.
    Returns the answer to send instead when the prefill leg failed."""
    cfg = runtime.config
    params = _kv_params(body)
    if cfg.role == "prefill" or params.get("do_remote_decode") is True:
        runtime.counters.prefill_legs += 1
        return Plan(dataclasses.replace(parsed, max_tokens=1), cfg.name, leg=True)
    target = prefill_target(request.headers.getall(PREFILLER_HEADER, []))
    if target:
        return await _remote_prefill(request, runtime, kind, body, parsed, target)
    if params.get("do_remote_prefill") is True:
        engine = params.get("remote_engine_id")
        return Plan(parsed, engine if isinstance(engine, str) else "?", remote=RemoteKV())
    return Plan(parsed, cfg.name)


async def _remote_prefill(
    request: web.Request,
    runtime: PodRuntime,
    kind: str,
    body: Mapping[str, Any],
    parsed: Parsed,
    target: str,
) -> Plan | web.Response:
    url = f"http://{target}{request.rel_url}"
    headers = {"content-type": "application/json", "x-request-id": str(uuid.uuid4())}
    data = orjson.dumps(prefill_leg_body(body, kind))
    timeout = aiohttp.ClientTimeout(total=PREFILL_TIMEOUT_S)
    try:
        async with runtime.http().post(url, data=data, headers=headers, timeout=timeout) as r:
            status, raw = r.status, await r.read()
            pod = r.headers.get("x-sim-pod", target)
            content_type = r.headers.get("content-type", "application/json")
    except (aiohttp.ClientError, TimeoutError) as exc:
        runtime.counters.prefill_failures += 1
        err = ApiError(502, f"prefill request to {target} failed: {exc!r}")
        return web.Response(status=502, body=orjson.dumps(err.body()), headers=_JSON)
    if not 200 <= status < 300:
        runtime.counters.prefill_failures += 1
        return web.Response(status=status, body=raw, headers={"content-type": content_type})
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, Mapping) or _kv_params(answer).get("do_remote_prefill") is not True:
        return Plan(parsed, runtime.config.name)  # no KV to pull: prefill here
    reported = None if kind == "responses" else cached_tokens(answer)
    return Plan(parsed, pod, remote=RemoteKV(reported))
