"""Closed-loop streaming load for ``epp bench chaos``: ``clients`` clients, each sending one
streamed completion after the other through Envoy until told to stop, recording every request.

A request is a small streamed ``/v1/completions`` call (a unique prompt, ``max_tokens`` tokens);
it *succeeds* when it is answered 200 and its stream reaches ``data: [DONE]`` within
``request_timeout``. Everything else (an HTTP error, a stream cut short, a reset, a timeout) is a
failure, recorded with the pod that served it (``x-sim-pod``, empty when no pod answered), the
status and the start of the error. A client whose request failed waits ``backoff`` seconds
before the next one, as real clients do, so a dead route is not hammered at loop speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

from epp_tools.bench.workloads.spec import MODEL


@dataclass
class Shot:
    """One request: times are ``time.perf_counter()`` seconds."""

    index: int
    sent: float
    ended: float = 0.0
    status: int = 0
    pod: str = ""
    complete: bool = False
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.complete


@dataclass
class StreamLoad:
    url: str
    clients: int = 6
    max_tokens: int = 48
    request_timeout: float = 5.0
    backoff: float = 0.05
    pause: float = 0.0
    """Think time after every request (a soak's modest pace)."""
    models: Sequence[str] = (MODEL,)
    """Model names, taken in turn (LoRA adapters in a soak)."""
    headers: Callable[[int], Mapping[str, str]] | None = None
    """Extra request headers of request ``i`` (fairness ids, sessions)."""
    shots: list[Shot] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> StreamLoad:
        self._task = asyncio.ensure_future(self._run())
        return self

    async def stop(self) -> list[Shot]:
        """Stop sending; requests in flight finish (bounded by ``request_timeout``)."""
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.shots

    async def _run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.clients, force_close=False)
        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            await asyncio.gather(*(self._client(http) for _ in range(self.clients)))

    async def _client(self, http: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            shot = Shot(index=len(self.shots), sent=time.perf_counter())
            self.shots.append(shot)
            await self._send(http, shot)
            shot.ended = time.perf_counter()
            wait = self.pause if shot.ok else max(self.pause, self.backoff)
            if wait:
                await asyncio.sleep(wait)

    async def _send(self, http: aiohttp.ClientSession, shot: Shot) -> None:
        body = {
            "model": self.models[shot.index % len(self.models)],
            "prompt": f"chaos request {shot.index}: say something",
            "max_tokens": self.max_tokens,
            "stream": True,
        }
        try:
            headers = self.headers(shot.index) if self.headers is not None else None
            url = f"{self.url}/v1/completions"
            async with http.post(url, json=body, headers=headers) as resp:
                shot.status = resp.status
                shot.pod = resp.headers.get("x-sim-pod", "")
                if resp.status != 200:
                    shot.error = (await resp.content.read(120)).decode("utf-8", "replace")
                    return
                async for line in resp.content:
                    if line.startswith(b"data: [DONE]"):
                        shot.complete = True
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            shot.error = f"{type(exc).__name__}: {exc}"[:120]


def failures(shots: Sequence[Shot]) -> list[Shot]:
    return [s for s in shots if not s.ok]


def between(shots: Sequence[Shot], t0: float, t1: float) -> list[Shot]:
    return [s for s in shots if t0 <= s.sent < t1]
