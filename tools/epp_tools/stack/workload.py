"""Short, seeded workloads and their driver (used by ``epp stack``).

``mixed_workload``: two request shapes, interleaved:
- shared system prompts: ``groups`` long system prompts, each reused by several users who ask
  their own short question;
- multi-turn sessions: each session resends its whole growing conversation every turn.

``agentic_workload``: a short run of coding agents, each resending a long and growing context
every turn: a harness prompt every agent shares (system prompt and tool schemas), the agent's
own task context (the files it read), then one tool result and its previous answer per turn.
A router that keeps an agent on the pod that holds its context prefills only the new tokens of
each turn; one that spreads the turns prefills the whole context again on a pod that has not
seen it (or has evicted it), which is what its time to first token shows.

``long_prompt_workload`` (``epp stack --pd``): unique long prompts with long answers, nothing to
reuse: what disaggregated prefill/decode is for.

Every request is a streamed chat completion with ``include_usage``, so the driver can read the
time to first token, the mean gap between content chunks (ITL), the output tokens and the
prefix-cache hit (``prompt_tokens_details.cached_tokens``) of each one.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

_WORDS = [
    "cache",
    "token",
    "prefix",
    "router",
    "pool",
    "model",
    "latency",
    "queue",
    "batch",
    "kernel",
    "tensor",
    "shard",
    "replica",
    "gateway",
    "envoy",
    "request",
    "stream",
    "decode",
    "prefill",
    "block",
    "memory",
    "agent",
    "session",
    "tool",
    "context",
    "policy",
    "fairness",
    "priority",
    "budget",
    "schedule",
    "metric",
    "scrape",
    "window",
    "sample",
    "score",
    "pick",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


@dataclass(frozen=True)
class WorkItem:
    session: str
    messages: tuple[dict[str, str], ...]
    max_tokens: int


@dataclass
class Result:
    pod: str
    status: int
    ttft: float
    latency: float
    prompt_tokens: int
    cached_tokens: int
    itl: float = math.nan
    tokens: int = 0
    sent: float = 0.0
    prefill_pod: str = ""
    first_token: float = 0.0
    """Time to the first content chunk (``ttft`` is to the first SSE line: for chat, the role
    chunk the server sends before prefilling)."""


def mixed_workload(
    *,
    seed: int = 1,
    groups: int = 4,
    users: int = 24,
    sessions: int = 6,
    turns: int = 6,
    system_words: int = 1200,
) -> list[list[WorkItem]]:
    """Waves of requests; requests within a wave may run concurrently, waves run in order
    (a session's next turn needs the previous one's answer)."""
    rng = random.Random(seed)
    systems = [_text(rng, system_words) for _ in range(groups)]
    waves: list[list[WorkItem]] = [[] for _ in range(turns)]
    for u in range(users):
        sys_prompt = systems[u % groups]
        question = _text(rng, 30)
        waves[u % turns].append(
            WorkItem(
                f"user-{u}",
                ({"role": "system", "content": sys_prompt}, {"role": "user", "content": question}),
                16,
            )
        )
    for s in range(sessions):
        convo: list[dict[str, str]] = [{"role": "system", "content": _text(rng, 400)}]
        for t in range(turns):
            convo.append({"role": "user", "content": _text(rng, 60)})
            waves[t].append(WorkItem(f"session-{s}", tuple(convo), 16))
            convo.append({"role": "assistant", "content": _text(rng, 16)})
    for w in waves:
        rng.shuffle(w)
    return waves


def agentic_workload(
    *,
    seed: int = 1,
    agents: int = 8,
    turns: int = 6,
    harness_words: int = 1500,
    context_words: int = 3000,
    result_words: int = 150,
) -> list[list[WorkItem]]:
    """One wave per turn, every agent's turn in it (an agent's next turn needs its answer)."""
    rng = random.Random(seed)
    harness = _text(rng, harness_words)
    waves: list[list[WorkItem]] = [[] for _ in range(turns)]
    for a in range(agents):
        convo: list[dict[str, str]] = [
            {"role": "system", "content": harness},
            {"role": "user", "content": _text(rng, context_words)},
        ]
        for t in range(turns):
            if t:
                convo.append({"role": "assistant", "content": _text(rng, 16)})
                convo.append({"role": "user", "content": _text(rng, result_words)})
            waves[t].append(WorkItem(f"agent-{a}", tuple(convo), 16))
    for w in waves:
        rng.shuffle(w)
    return waves


def long_prompt_workload(
    *, seed: int = 1, requests: int = 32, prompt_words: int = 4000, max_tokens: int = 256
) -> list[list[WorkItem]]:
    """One wave of unique long prompts (a document and a question) with long answers."""
    rng = random.Random(seed)
    return [
        [
            WorkItem(
                f"doc-{i}", ({"role": "user", "content": _text(rng, prompt_words)},), max_tokens
            )
            for i in range(requests)
        ]
    ]


async def _one(session: aiohttp.ClientSession, url: str, model: str, item: WorkItem) -> Result:
    body = {
        "model": model,
        "messages": list(item.messages),
        "max_tokens": item.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft = 0.0
    usage: dict[str, Any] = {}
    chunks: list[float] = []  # arrival of each content chunk
    async with session.post(f"{url}/v1/chat/completions", json=body) as r:
        pod = r.headers.get("x-sim-pod", "?")
        if r.status != 200:
            await r.read()
            return Result(pod, r.status, 0.0, time.perf_counter() - t0, 0, 0, sent=t0)
        async for line in r.content:
            if not ttft and line.startswith(b"data: "):
                ttft = time.perf_counter() - t0
            if b'"content":"' in line and b'"content":""' not in line:
                chunks.append(time.perf_counter())
            if line.startswith(b"data: {") and b'"usage"' in line:
                usage = json.loads(line[6:]).get("usage") or usage
        prefill_pod = r.headers.get("x-sim-prefill-pod", "")
    details = usage.get("prompt_tokens_details") or {}
    itl = (chunks[-1] - chunks[0]) / (len(chunks) - 1) if len(chunks) > 1 else math.nan
    return Result(
        pod,
        200,
        ttft,
        time.perf_counter() - t0,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens", 0)),
        itl,
        int(usage.get("completion_tokens", len(chunks))),
        t0,
        prefill_pod,
        chunks[0] - t0 if chunks else 0.0,
    )


async def drive(
    url: str,
    waves: Sequence[Sequence[WorkItem]],
    *,
    model: str,
    concurrency: int = 8,
    timeout: float = 60.0,
) -> list[Result]:
    results: list[Result] = []
    sem = asyncio.Semaphore(concurrency)
    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(timeout)) as s:

        async def run(item: WorkItem) -> None:
            async with sem:
                results.append(await _one(s, url, model, item))

        for wave in waves:
            await asyncio.gather(*(run(i) for i in wave))
    return results


@dataclass
class Summary:
    target: str
    requests: int = 0
    errors: int = 0
    hit_ratio: float = 0.0
    ttft_p50_ms: float = 0.0
    ttft_p90_ms: float = 0.0
    per_pod: dict[str, int] = field(default_factory=dict)
    first_token_p50_ms: float = 0.0
    first_token_p90_ms: float = 0.0
    itl_p50_ms: float = 0.0
    itl_p90_ms: float = 0.0
    out_tok_per_s: float = 0.0
    remote_prefills: int = 0
    """Answers whose prompt another pod prefilled (``x-sim-prefill-pod`` is not the pod)."""


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(target: str, results: Sequence[Result]) -> Summary:
    ok = [r for r in results if r.status == 200]
    prompt = sum(r.prompt_tokens for r in ok)
    per_pod: dict[str, int] = {}
    for r in ok:
        per_pod[r.pod] = per_pod.get(r.pod, 0) + 1
    ttfts = [r.ttft for r in ok]
    itls = [r.itl for r in ok if not math.isnan(r.itl)]
    span = max((r.sent + r.latency for r in ok), default=0.0) - min(
        (r.sent for r in ok), default=0.0
    )
    return Summary(
        target=target,
        requests=len(results),
        errors=len(results) - len(ok),
        hit_ratio=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        ttft_p50_ms=_pct(ttfts, 0.5) * 1000,
        ttft_p90_ms=_pct(ttfts, 0.9) * 1000,
        per_pod=dict(sorted(per_pod.items())),
        first_token_p50_ms=_pct([r.first_token for r in ok], 0.5) * 1000,
        first_token_p90_ms=_pct([r.first_token for r in ok], 0.9) * 1000,
        itl_p50_ms=_pct(itls, 0.5) * 1000,
        itl_p90_ms=_pct(itls, 0.9) * 1000,
        out_tok_per_s=sum(r.tokens for r in ok) / span if span > 0 else 0.0,
        remote_prefills=sum(1 for r in ok if r.prefill_pod and r.prefill_pod != r.pod),
    )


def table(rows: Sequence[Summary], *, first_token: bool = False) -> str:
    """Requests, errors, hit ratio and TTFT per target, with each pod's share of the requests.
    TTFT is to the first SSE line (for chat, the role chunk the server sends before prefilling),
    or with ``first_token`` to the first content token, which includes the prefill: what keeping
    an agent on the pod that holds its context saves."""
    head = (
        f"{'target':<24}{'requests':>9}{'errors':>7}{'cache hit':>10}{'TTFT p50':>10}"
        f"{'TTFT p90':>10}  requests per pod"
    )
    lines = [head, "-" * len(head)]
    for s in rows:
        p50, p90 = (
            (s.first_token_p50_ms, s.first_token_p90_ms)
            if first_token
            else (s.ttft_p50_ms, s.ttft_p90_ms)
        )
        pods = " ".join(f"{k}:{v}" for k, v in s.per_pod.items())
        lines.append(
            f"{s.target:<24}{s.requests:>9}{s.errors:>7}{s.hit_ratio:>9.1%} "
            f"{p50:>7.1f}ms{p90:>8.1f}ms  {pods}"
        )
    return "\n".join(lines)


def pd_table(rows: Sequence[Summary]) -> str:
    """Latency (TTFT to the first content chunk) and throughput side by side, and the share of
    answers prefilled on another pod (``epp stack --pd``)."""
    head = (
        f"{'target':<28}{'requests':>9}{'errors':>7}{'TTFT p50':>10}{'TTFT p90':>10}"
        f"{'ITL p50':>9}{'ITL p90':>9}{'out tok/s':>10}{'remote prefill':>15}"
    )
    lines = [head, "-" * len(head)]
    for s in rows:
        ok = s.requests - s.errors
        share = s.remote_prefills / ok if ok else 0.0
        lines.append(
            f"{s.target:<28}{s.requests:>9}{s.errors:>7}{s.first_token_p50_ms:>8.1f}ms"
            f"{s.first_token_p90_ms:>8.1f}ms{s.itl_p50_ms:>7.2f}ms{s.itl_p90_ms:>7.2f}ms"
            f"{s.out_tok_per_s:>10.0f}{share:>15.0%}"
        )
    return "\n".join(lines)
