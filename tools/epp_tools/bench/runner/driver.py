"""The load generator: sends a workload's requests to one target URL and times every token.

Sessions run concurrently, the turns of one session one after the other; at most
``concurrency`` requests are in flight; a request with ``at`` > 0 is not sent before
``at / time_scale`` wall-clock seconds after the start (open-loop arrivals); a session whose
first request has ``after`` starts once that request of another session has finished (or at
once if it is not part of the run). Connections are reused (keep-alive), as real load
generators do; ``probe`` measures fresh connections.

Responses API sessions (``BenchRequest.api == "responses"``): a turn whose predecessor in the
session was answered is sent as a follow-up (``previous_response_id`` of that answer and only the
new message, no session header). A follow-up answered 404 (it reached a pod that does not hold
the previous response) is sent again at once as a new chain carrying the whole conversation, as
a client that lost the server's state does: the server then sees the same prompt, the next turn
follows up on the new answer, and the run goes on. The turn's ``Outcome`` is the resend's, with
``followup_status`` 404, ``lost_pod`` naming the pod that refused it and the lost round trip
added to its TTFT and latency. A turn whose predecessor failed starts a new chain the same way.

Per request (``Outcome``): HTTP status, the pod that served it (``x-sim-pod``), time to first
token (first SSE chunk carrying content; the chat role chunk the server sends at once does not
count; for Responses, the first ``response.output_text.delta`` event), the mean gap between
content chunks (ITL), the chunk count and the usage block (``prompt_tokens``,
``prompt_tokens_details.cached_tokens``; Responses: ``input_tokens``,
``input_tokens_details.cached_tokens`` and the response id); for a refused request, the
``x-llm-d-request-dropped-reason`` header (``reason``) and the start of the body (``error``).

Every wait is bounded: ``request_timeout`` per request and ``deadline`` for the whole run;
requests not finished by then are recorded with status 0.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from epp_tools.bench.workloads.spec import MODEL, BenchRequest

_CONTENT = b'"content":"'
_EMPTY_CONTENT = b'"content":""'
_DELTA = b'"response.output_text.delta"'
_CREATED = b'"response.created"'
_COMPLETED = b'"response.completed"'
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"


@dataclass
class Outcome:
    index: int
    session: str
    objective: str
    status: int
    pod: str = ""
    sent: float = 0.0
    ttft: float = math.nan
    latency: float = math.nan
    tokens: int = 0
    itl: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""
    tenant: str = ""
    reason: str = ""
    turn: int = 0
    api: str = "chat"
    response_id: str = ""
    followup_status: int = 0
    """Status of the ``previous_response_id`` attempt (0: the turn was not a follow-up)."""
    lost_pod: str = ""
    """The pod that answered a follow-up with 404 (the turn was then resent)."""

    @property
    def ok(self) -> bool:
        """Answered 200 and streamed to its end (a stream cut midway leaves an error)."""
        return self.status == 200 and self.tokens > 0 and not self.error


async def _read_stream(
    response: aiohttp.ClientResponse,
    t0: float,
    out: Outcome,
    on_first_token: Callable[[], None] | None,
) -> None:
    first = last = 0.0
    usage: dict[str, Any] = {}
    async for line in response.content:
        if not line.startswith(b"data: {"):
            continue
        if _CONTENT in line and _EMPTY_CONTENT not in line:
            now = time.perf_counter()
            if not out.tokens:
                first = now
                if on_first_token is not None:
                    on_first_token()
            last = now
            out.tokens += 1
        elif b'"usage"' in line:
            usage = orjson.loads(line[6:]).get("usage") or usage
    _finish(out, t0, first, last, usage, "prompt_tokens", "prompt_tokens_details")


def _json(line: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(line[6:])
    except orjson.JSONDecodeError:
        return {}
    response = data.get("response") if isinstance(data, dict) else None
    return response if isinstance(response, dict) else {}


async def _read_responses_stream(
    response: aiohttp.ClientResponse,
    t0: float,
    out: Outcome,
    on_first_token: Callable[[], None] | None,
) -> None:
    first = last = 0.0
    usage: dict[str, Any] = {}
    async for line in response.content:
        if not line.startswith(b"data: {"):
            continue
        if _DELTA in line:
            now = time.perf_counter()
            if not out.tokens:
                first = now
                if on_first_token is not None:
                    on_first_token()
            last = now
            out.tokens += 1
        elif _CREATED in line:
            out.response_id = str(_json(line).get("id") or "")
        elif _COMPLETED in line:
            usage = _json(line).get("usage") or usage
    _finish(out, t0, first, last, usage, "input_tokens", "input_tokens_details")


def _finish(
    out: Outcome,
    t0: float,
    first: float,
    last: float,
    usage: dict[str, Any],
    prompt_key: str,
    details_key: str,
) -> None:
    """Timing from the first and last token, and the usage block's prompt and cached tokens
    (chat and completions name them ``prompt_*``, the Responses API ``input_*``)."""
    if out.tokens:
        out.ttft = first - t0
        if out.tokens > 1:
            out.itl = (last - first) / (out.tokens - 1)
    out.prompt_tokens = int(usage.get(prompt_key, 0))
    details = usage.get(details_key) or {}
    out.cached_tokens = int(details.get("cached_tokens", 0))


async def send(
    session: aiohttp.ClientSession,
    url: str,
    index: int,
    req: BenchRequest,
    start: float,
    previous_response_id: str = "",
    on_first_token: Callable[[], None] | None = None,
) -> Outcome:
    """One request, streamed to its end; ``on_first_token`` (if given) is called when the first
    token arrives (the prefill is done)."""
    out = Outcome(index, req.session, req.objective, 0, tenant=req.fairness_id)
    out.turn, out.api = req.turn, req.api
    body = orjson.dumps(req.body(previous_response_id))
    t0 = time.perf_counter()
    out.sent = t0 - start
    try:
        async with session.post(f"{url}{req.path}", data=body, headers=req.headers()) as r:
            out.status = r.status
            out.pod = r.headers.get("x-sim-pod", "")
            if r.status == 200:
                reader = _read_responses_stream if req.api == "responses" else _read_stream
                await reader(r, t0, out, on_first_token)
            else:
                out.error = (await r.read())[:200].decode(errors="replace")
                out.reason = r.headers.get(DROPPED_REASON_HEADER, "")
    except Exception as exc:  # a broken response is a failed request, not a failed run
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.latency = time.perf_counter() - t0
    return out


async def send_turn(
    session: aiohttp.ClientSession,
    url: str,
    index: int,
    req: BenchRequest,
    start: float,
    previous_response_id: str = "",
    on_first_token: Callable[[], None] | None = None,
) -> Outcome:
    """One turn: a Responses follow-up when there is a previous answer, resent as a new chain
    when the follow-up is answered 404 (see the module doc); anything else as it is."""
    if req.api != "responses" or not previous_response_id:
        return await send(session, url, index, req, start, "", on_first_token)
    first = await send(session, url, index, req, start, previous_response_id, on_first_token)
    first.followup_status = first.status
    if first.status != 404:
        return first
    again = await send(session, url, index, req, start, "", on_first_token)
    lost = again.sent - first.sent
    again.sent = first.sent
    again.ttft += lost
    again.latency += lost
    again.followup_status, again.lost_pod = 404, first.pod
    return again


async def run(
    url: str,
    requests: Sequence[BenchRequest],
    *,
    concurrency: int,
    time_scale: float = 1.0,
    request_timeout: float = 180.0,
    deadline: float = 600.0,
) -> list[Outcome]:
    index = {id(r): i for i, r in enumerate(requests)}
    sessions: dict[str, list[BenchRequest]] = {}
    for r in requests:
        sessions.setdefault(r.session, []).append(r)
    finished = {(r.session, r.turn): asyncio.Event() for r in requests}
    done: dict[int, Outcome] = {}
    sem = asyncio.Semaphore(max(1, concurrency))
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def conversation(turns: list[BenchRequest]) -> None:
            parent = finished.get(turns[0].after) if turns[0].after else None
            if parent is not None:
                await parent.wait()
            chain = ""  # the response id a Responses turn follows up on
            for req in turns:
                delay = start + req.at / time_scale - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with sem:
                    i = index[id(req)]
                    done[i] = await send_turn(http, url, i, req, start, chain)
                chain = done[i].response_id if done[i].ok else ""
                finished[(req.session, req.turn)].set()

        tasks = [asyncio.ensure_future(conversation(turns)) for turns in sessions.values()]
        try:
            async with asyncio.timeout(deadline):
                await asyncio.gather(*tasks)
        except TimeoutError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return [done.get(i) or _unfinished(i, r) for i, r in enumerate(requests)]


def _unfinished(i: int, r: BenchRequest) -> Outcome:
    error = "not finished by the deadline"
    return Outcome(i, r.session, r.objective, 0, error=error, tenant=r.fairness_id, turn=r.turn)


def probe_request(i: int) -> BenchRequest:
    """A small request of its own (no prefix shared with any workload)."""
    text = f"probe {i:04d} " + "ping " * 24
    return BenchRequest(f"probe-{i}", 0, MODEL, ({"role": "user", "content": text},), 8)


async def probe(url: str, n: int = 10, timeout: float = 30.0) -> dict[str, list[float]]:
    """TTFT of ``n`` sequential requests on fresh connections and ``n`` on one reused one.

    A router that does not set TCP_NODELAY on client sockets shows it only on reused
    connections (Nagle plus delayed ACK: about 40 ms per streamed response).
    """
    result: dict[str, list[float]] = {"fresh": [], "reused": []}
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    start = time.perf_counter()
    for i in range(n):
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as http:
            out = await send(http, url, i, probe_request(i), start)
        if out.ok:
            result["fresh"].append(out.ttft)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as http:
        for i in range(n, 2 * n + 1):
            out = await send(http, url, i, probe_request(i), start)
            if out.ok and i > n:  # the first one opens the connection
                result["reused"].append(out.ttft)
    return result


WARMUP_TIMEOUT = 30.0
"""The bound of a warm-up: the first request a target answers, or warming the pods."""


async def warm_up(url: str) -> None:
    """One small request until it is answered 200 (the target may still be connecting)."""
    deadline = time.monotonic() + WARMUP_TIMEOUT
    last = ""
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        while time.monotonic() < deadline:
            out = await send(http, url, 0, probe_request(9999), time.perf_counter())
            if out.ok:
                return
            last = out.error or f"HTTP {out.status}"
            await asyncio.sleep(0.2)
    raise RuntimeError(f"warm-up request never succeeded: {last}")
