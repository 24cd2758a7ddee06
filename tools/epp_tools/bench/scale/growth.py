"""``epp bench scale growth``: how the EPP's CPU per request grows with pods, live sessions and
context length, and its memory with live sessions, measured in process.

Why in process: 256 pods and 10,000 live sessions of real traffic are beyond what a 2-core
machine can drive through Envoy beside a simulator; the request path is the same code either
way. Each curve runs in a fresh process, its points together, one
``epp_tools.bench.scale.inproc.InProcessEpp`` (``pods`` synthetic pods) per point:

1. populate, one point after the other: one first turn per session (``sessions`` of them, a
   shared 500-token system prompt and a context of ``context`` tokens of their own; half on the
   Responses API, whose answers carry a response id the EPP binds to the pod), so the EPP holds
   each session's prefix blocks and response binding; the RSS the process gained meanwhile
   (``gc.collect`` first) is what the sessions cost;
2. measure, the points interleaved (one request of each, then the next round: on a shared
   machine one point measured alone can be 30% off another measured a minute later):
   ``requests`` follow-up turns of sessions drawn at random (chat: the whole growing
   conversation; Responses: ``previous_response_id`` and the new message), ``IN_FLIGHT`` (256) of
   them open at a time as on a loaded EPP, each answered with 4 streamed chunks and a final usage
   chunk; the CPU of each request (``InProcessEpp.open`` and ``close``), median.

Curves (defaults; ``--quick`` uses fewer and smaller points): CPU per request against pods (4,
16, 64, 256; 500 sessions of 8k tokens), against live sessions (100, 1,000, 10,000; 16 pods, 4k
tokens) and against context length (4k, 16k, 64k, 200k tokens; 16 pods, 50 sessions); RSS against
live sessions. Writes ``growth.json``, ``growth.md`` and ``growth.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from epp_tools.bench.scale.inproc import InProcessEpp, chat_body
from epp_tools.bench.workloads.text import words
from epp_tools.stack.procs import rss_bytes

OUT = Path("docs/benchmarks/scale")
SYSTEM_WORDS = 500
TOOL_WORDS = 64
CHUNKS = 4
CURVE_TIMEOUT = 1_800.0
IN_FLIGHT = 256
"""Requests each point keeps open while it measures."""


@dataclass(frozen=True)
class Point:
    pods: int
    sessions: int
    context: int
    requests: int
    cpu_us_median: float = 0.0
    cpu_us_mean: float = 0.0
    rss_mb_sessions: float = 0.0
    """RSS added by populating the sessions."""
    rss_mb: float = 0.0
    """The measuring process's RSS at the end (every point of the curve)."""
    failed: int = 0


class Sessions:
    """Session texts regenerated from the seed on demand (nothing kept but turn counters)."""

    def __init__(self, n: int, context: int, seed: int) -> None:
        self.context = context
        self.seed = seed
        self.turns = [0] * n
        self.system = words(random.Random(seed), SYSTEM_WORDS)

    def request(self, s: int) -> tuple[str, bytes, list[bytes]]:
        """Session ``s``'s next turn: (path, body, response chunks)."""
        t = self.turns[s]
        self.turns[s] += 1
        rng = random.Random(self.seed * 1_000_003 + s)
        first = {"role": "user", "content": words(rng, self.context)}
        history: list[dict[str, str]] = [first]
        for k in range(1, t + 1):
            history.append({"role": "assistant", "content": words(rng, 8)})
            history.append({"role": "user", "content": f"t{k:03d} " + words(rng, TOOL_WORDS)})
        prompt = SYSTEM_WORDS + self.context + t * (TOOL_WORDS + 9)
        if s % 2 == 0:
            messages = [{"role": "system", "content": self.system}, *history]
            return "/v1/chat/completions", chat_body(messages, 8), _chat_chunks(prompt)
        body: dict[str, Any] = {"model": "sim-model", "stream": True, "max_output_tokens": 8}
        if t == 0:
            body |= {"instructions": self.system, "input": history}
        else:
            body |= {"previous_response_id": f"resp_{s}_{t - 1}", "input": history[-1:]}
        return "/v1/responses", orjson.dumps(body), _responses_chunks(f"resp_{s}_{t}", prompt)


def _chat_chunks(prompt: int) -> list[bytes]:
    delta = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
    out = [delta + b'{"content":"the "}}]}\n\n'] * CHUNKS
    usage = {"prompt_tokens": prompt, "completion_tokens": CHUNKS, "total_tokens": prompt + 4,
             "prompt_tokens_details": {"cached_tokens": prompt - 80}}  # fmt: skip
    last = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    out.append(b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n")
    return out


def _responses_chunks(rid: str, prompt: int) -> list[bytes]:
    def event(kind: str, data: dict[str, Any]) -> bytes:
        return f"event: {kind}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

    usage = {"input_tokens": prompt, "output_tokens": CHUNKS, "total_tokens": prompt + 4,
             "input_tokens_details": {"cached_tokens": prompt - 80}}  # fmt: skip
    out = [event("response.created", {"type": "response.created", "response": {"id": rid}})]
    delta = {"type": "response.output_text.delta", "delta": "the "}
    out += [event("response.output_text.delta", delta)] * CHUNKS
    done = {"type": "response.completed", "response": {"id": rid, "usage": usage}}
    out.append(event("response.completed", done))
    return out


async def _populate(epp: InProcessEpp, sessions: Sessions, n: int) -> float:
    """Every session's first turn; the RSS (MB) this process gained meanwhile."""
    gc.collect()
    before = rss_bytes(os.getpid())
    for s in range(n):
        if s % 500 == 0:
            epp.refresh_metrics()
        await epp.request(*sessions.request(s))
    gc.collect()
    return (rss_bytes(os.getpid()) - before) / 2**20


class _Lane:
    """One point's requests: ``IN_FLIGHT`` of them open at a time, the oldest answered as the next
    one is sent (a loaded EPP holds thousands in flight: their records are what it reads)."""

    def __init__(self, epp: InProcessEpp, sessions: Sessions, rng: random.Random, p: Point):
        self.epp, self.sessions, self.rng, self.point = epp, sessions, rng, p
        self.open: deque[tuple[int, float, list[bytes]]] = deque()
        self.spent: list[float] = []

    async def step(self, i: int) -> None:
        if i < self.point.requests:
            if i % 100 == 0:
                self.epp.refresh_metrics()
            path, body, chunks = self.sessions.request(self.rng.randrange(self.point.sessions))
            sid, cpu = await self.epp.open(path, body)
            self.open.append((sid, cpu, chunks))
        if self.open and (len(self.open) > IN_FLIGHT or i >= self.point.requests):
            sid, cpu, chunks = self.open.popleft()
            self.spent.append((cpu + (self.epp.close(sid, chunks) if sid else 0.0)) * 1e6)


async def measure_curve(points: Sequence[Point], seed: int) -> list[Point]:
    """The points of one curve, measured together: one EPP per point in this process, each
    populated in turn, then their requests interleaved (one request of each point, then the next
    round), so that a change in the machine's speed meets every point alike."""
    async with AsyncExitStack() as stack:
        epps = [await stack.enter_async_context(InProcessEpp(p.pods, seed)) for p in points]
        sessions = [Sessions(p.sessions, p.context, seed) for p in points]
        added = [
            await _populate(e, s, p.sessions)
            for e, s, p in zip(epps, sessions, points, strict=True)
        ]
        lanes = [_Lane(e, s, random.Random(seed + 7), p) for e, s, p in
                 zip(epps, sessions, points, strict=True)]  # fmt: skip
        for i in range(max(p.requests for p in points) + IN_FLIGHT):
            for lane in lanes:
                await lane.step(i)
        spent = [lane.spent for lane in lanes]
        rss = rss_bytes(os.getpid()) / 2**20
        return [
            Point(p.pods, p.sessions, p.context, p.requests, round(statistics.median(us), 1),
                  round(statistics.mean(us), 1), round(mb, 1), round(rss, 1), e.failed)
            for p, us, mb, e in zip(points, spent, added, epps, strict=True)
        ]  # fmt: skip


@dataclass(frozen=True)
class Plan:
    pods: tuple[int, ...] = (4, 16, 64, 256)
    sessions: tuple[int, ...] = (100, 1_000, 10_000)
    contexts: tuple[int, ...] = (4_096, 16_384, 65_536, 200_000)
    requests: int = 1_000
    context_requests: int = 150


QUICK_PLAN = Plan(pods=(4, 16), sessions=(100, 400), contexts=(4_096, 16_384), requests=100,
                  context_requests=40)  # fmt: skip


def specs(plan: Plan) -> dict[str, list[Point]]:
    return {
        "pods": [Point(n, 500, 8_192, plan.requests) for n in plan.pods],
        "sessions": [Point(16, n, 4_096, plan.requests) for n in plan.sessions],
        "context": [Point(16, 50, n, plan.context_requests) for n in plan.contexts],
    }


def curve_in_child(points: Sequence[Point], seed: int) -> list[Point]:
    """``measure_curve`` in a fresh process, so that memory one curve freed does not hide what
    the next one allocates."""
    argv = [sys.executable, "-m", "epp_tools.bench.scale.growth", "--curve",
            json.dumps([asdict(p) for p in points]), "--seed", str(seed)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CURVE_TIMEOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"curve {points[0]} ... failed: {done.stderr[-1500:]}")
    return [Point(**p) for p in json.loads(done.stdout.strip().splitlines()[-1])]


def curves(plan: Plan, seed: int) -> dict[str, list[Point]]:
    out: dict[str, list[Point]] = {}
    for name, points in specs(plan).items():
        t0 = time.monotonic()
        out[name] = curve_in_child(points, seed)
        for pt in out[name]:
            print(f"bench scale growth: {name}: {pt}", flush=True)
        print(f"bench scale growth: {name} [{time.monotonic() - t0:.1f}s]", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="epp bench scale growth", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="fewer, smaller points (CI)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--curve", default="", help=argparse.SUPPRESS)  # one curve, in a child
    args = p.parse_args(argv)
    if args.curve:
        points = [Point(**d) for d in json.loads(args.curve)]
        print(json.dumps([asdict(pt) for pt in asyncio.run(measure_curve(points, args.seed))]))
        return 0
    from epp_tools.bench.scale.growth_report import write

    plan = QUICK_PLAN if args.quick else Plan()
    result = curves(plan, args.seed)
    command = "epp bench scale growth" + (" --quick" if args.quick else "")
    paths = write(result, args.out, command, quick=args.quick)
    print(paths[1].read_text())
    return 0 if not any(pt.failed for pts in result.values() for pt in pts) else 1


if __name__ == "__main__":
    sys.exit(main())
