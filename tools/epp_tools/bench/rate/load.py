"""The open-loop client of ``epp bench rate`` and the CPU pinning of its processes.

``open_loop`` sends one request at each time of an arrival schedule (``epp_tools.bench.rate.stats``)
whether or not earlier ones were answered, over keep-alive HTTP/1.1 connections (aiohttp, at
most ``max_in_flight`` open at once). A request due while ``max_in_flight`` are outstanding is
not sent and counts as an error (``client cap``): the target fell that far behind. Every
request is bounded by ``timeout``; the step by the schedule plus ``timeout``. Per request it
keeps the send lag (how late the client sent it against its schedule: the client's own
bottleneck shows there), the status and the latency to the last byte of the answer.

The requests are small chat completions as in llm-d-router's ``high_qps_small_token`` perf
study (about 200 prompt tokens, ``max_tokens`` output): one of ``groups`` shared 100-word system
prompts plus a 100-word user message of its own (1 word = 1 token,
``epp_tools.bench.workloads.text``), so the prefix scorer finds partial hits; ``stream`` makes the
answer a token-per-chunk SSE stream.

``pin`` sets the CPU affinity of every thread of a process (what ``taskset -a -p -c`` does);
threads started later inherit it. ``runqueue_wait_seconds`` reads how long a process's threads
waited for a CPU while runnable (schedstat): on a shared machine, the time others took from it.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from epp_tools.bench.workloads.spec import MODEL
from epp_tools.bench.workloads.text import words

PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Shot:
    """One scheduled request: its send lag, HTTP status (0: not answered) and latency (s)."""

    lag: float
    status: int = 0
    latency: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error


def bodies(
    n: int, seed: int = 1, groups: int = 8, max_tokens: int = 100, stream: bool = False
) -> list[bytes]:
    """``n`` request bodies (JSON bytes), built before the step so sending costs no JSON work."""
    rng = random.Random(seed)
    systems = [words(rng, 100) for _ in range(groups)]
    out = []
    for i in range(n):
        messages = [
            {"role": "system", "content": systems[i % groups]},
            {"role": "user", "content": f"q{i} " + words(rng, 99)},
        ]
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
        out.append(orjson.dumps(body))
    return out


async def _one(
    http: aiohttp.ClientSession, url: str, body: bytes, lag: float, stream: bool
) -> Shot:
    t0 = time.perf_counter()
    try:
        async with http.post(url, data=body, headers={"content-type": "application/json"}) as r:
            if stream:
                async for _ in r.content.iter_any():
                    pass
                data = b""
            else:
                data = await r.read()
            status = r.status
        error = "" if status == 200 else data[:120].decode(errors="replace")
        return Shot(lag, status, time.perf_counter() - t0, error)
    except Exception as exc:  # a failed request is a result of the step, not a failed run
        return Shot(lag, 0, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:120])


async def open_loop(
    url: str,
    payloads: Sequence[bytes],
    times: Sequence[float],
    *,
    timeout: float = 10.0,
    max_in_flight: int = 512,
    stream: bool = False,
) -> tuple[list[Shot], float]:
    """Send ``payloads[i]`` at ``times[i]`` (s from now); returns the shots and the wall time
    from the first scheduled send to the last answer."""
    connector = aiohttp.TCPConnector(limit=max_in_flight, limit_per_host=max_in_flight)
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    shots: list[Shot | None] = [None] * len(times)
    pending: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=connector, timeout=client_timeout) as http:

        async def fire(i: int, lag: float) -> None:
            shots[i] = await _one(http, url + PATH, payloads[i % len(payloads)], lag, stream)

        start = time.perf_counter() + 0.01
        for i, at in enumerate(times):
            delay = start + at - time.perf_counter()
            await asyncio.sleep(max(0.0, delay))
            lag = time.perf_counter() - start - at
            if len(pending) >= max_in_flight:
                shots[i] = Shot(lag, 0, 0.0, "client cap")
                continue
            task = asyncio.create_task(fire(i, lag))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(set(pending), timeout=timeout + 5.0)
        wall = time.perf_counter() - start
        for task in list(pending):  # past every request's own timeout: recorded unfinished
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [s or Shot(0.0, 0, 0.0, "not finished") for s in shots], wall


def runqueue_wait_seconds(pid: int) -> float:
    """Time every thread of ``pid`` spent runnable but waiting for a CPU so far (the second
    field of ``/proc/<pid>/task/<tid>/schedstat``, in ns): what other processes on the EPP's
    core took from it. 0.0 when the kernel does not keep schedstats or ``pid`` is gone."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0.0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def pin(pid: int, cpus: Iterable[int]) -> None:
    """CPU affinity of every thread of ``pid`` (no-op for an empty set or pid 0)."""
    chosen = set(cpus)
    if not chosen or pid <= 0:
        return
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), chosen)
        except (ProcessLookupError, ValueError):
            continue  # the thread ended meanwhile
