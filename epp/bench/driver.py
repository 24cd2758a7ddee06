"""The load generator: sends a workload's requests to one target URL and times every token.

Sessions run concurrently, the turns of one session one after the other; at most
``concurrency`` requests are in flight; a request with ``at`` > 0 is not sent before
``at / time_scale`` wall-clock seconds after the start (open-loop arrivals). Connections are
reused (keep-alive), as real load generators do; ``probe`` measures fresh connections.

Per request (``Outcome``): HTTP status, the pod that served it (``x-sim-pod``), time to first
token (first SSE chunk carrying content; the chat role chunk the server sends at once does not
count), the mean gap between content chunks (ITL), the chunk count and the usage block
(``prompt_tokens``, ``prompt_tokens_details.cached_tokens``); for a refused request, the
``x-llm-d-request-dropped-reason`` header (``reason``) and the start of the body (``error``).

Every wait is bounded: ``request_timeout`` per request and ``deadline`` for the whole run;
requests not finished by then are recorded with status 0.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from epp.bench.spec import MODEL, BenchRequest

_CONTENT = b'"content":"'
_EMPTY_CONTENT = b'"content":""'
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

    @property
    def ok(self) -> bool:
        """Answered 200 and streamed to its end (a stream cut midway leaves an error)."""
        return self.status == 200 and self.tokens > 0 and not self.error


async def _read_stream(response: aiohttp.ClientResponse, t0: float, out: Outcome) -> None:
    first = last = 0.0
    usage: dict[str, Any] = {}
    async for line in response.content:
        if not line.startswith(b"data: {"):
            continue
        if _CONTENT in line and _EMPTY_CONTENT not in line:
            now = time.perf_counter()
            if not out.tokens:
                first = now
            last = now
            out.tokens += 1
        elif b'"usage"' in line:
            usage = orjson.loads(line[6:]).get("usage") or usage
    if out.tokens:
        out.ttft = first - t0
        if out.tokens > 1:
            out.itl = (last - first) / (out.tokens - 1)
    out.prompt_tokens = int(usage.get("prompt_tokens", 0))
    details = usage.get("prompt_tokens_details") or {}
    out.cached_tokens = int(details.get("cached_tokens", 0))


async def send(
    session: aiohttp.ClientSession, url: str, index: int, req: BenchRequest, start: float
) -> Outcome:
    out = Outcome(index, req.session, req.objective, 0, tenant=req.fairness_id)
    body = orjson.dumps(req.body())
    t0 = time.perf_counter()
    out.sent = t0 - start
    try:
        async with session.post(
            f"{url}/v1/chat/completions", data=body, headers=req.headers()
        ) as r:
            out.status = r.status
            out.pod = r.headers.get("x-sim-pod", "")
            if r.status == 200:
                await _read_stream(r, t0, out)
            else:
                out.error = (await r.read())[:200].decode(errors="replace")
                out.reason = r.headers.get(DROPPED_REASON_HEADER, "")
    except Exception as exc:  # a broken response is a failed request, not a failed run
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    out.latency = time.perf_counter() - t0
    return out


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
    done: dict[int, Outcome] = {}
    sem = asyncio.Semaphore(max(1, concurrency))
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), force_close=False)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    start = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def conversation(turns: list[BenchRequest]) -> None:
            for req in turns:
                delay = start + req.at / time_scale - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                async with sem:
                    i = index[id(req)]
                    done[i] = await send(http, url, i, req, start)

        tasks = [asyncio.ensure_future(conversation(turns)) for turns in sessions.values()]
        try:
            async with asyncio.timeout(deadline):
                await asyncio.gather(*tasks)
        except TimeoutError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return [
        done.get(i)
        or Outcome(
            i, r.session, r.objective, 0, error="not finished by the deadline", tenant=r.fairness_id
        )
        for i, r in enumerate(requests)
    ]


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
