"""What a request holds in the EPP while its answer streams: Python's traced allocations per
routed request, with its content kept (as before ``Director.sent``) and let go (as the server
does once the routed body is on its way).

A whole EPP in process (``App``, the built-in default config: prefix producer and scorer, KV and
queue scorers; four endpoints nobody serves, which scheduling does not need) routes ``requests``
chat requests of about ``tokens`` prompt tokens, each a copy of one long context with its own
last words, as an agent's next turns are: the shared prefix is indexed once, up front, so what is
measured is what each request holds, not the prefix index (bounded on its own). The exchanges
are kept as the server keeps them while answers stream; ``tracemalloc`` counts what they hold,
the body's bytes included (copied as the server copies what it received); the prefix producer's
cache of recent prompts (``ChainCache``, at most 8 MiB whatever the load) is emptied before
counting::

    python -m epp_tools.bench.scale.retain            # 20 requests of 195,000 tokens
    python -m epp_tools.bench.scale.retain --quick    # 10 of 20,000 (tests)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from epp.plugins.producers.prefix_index import ChainCache
from epp.requestcontrol.director import Director
from epp.requestcontrol.exchange import Exchange
from epp_tools.bench.micro.chunkcost import epp_app
from epp_tools.bench.workloads.spec import MODEL
from epp_tools.bench.workloads.text import words

HEADERS = {":path": "/v1/chat/completions", "content-type": "application/json"}
_ROUTE_TRIES = 100  # x 50 ms: the endpoints' file discovery has run by then


@dataclass(frozen=True)
class Options:
    requests: int = 20
    tokens: int = 195_000
    seed: int = 1


QUICK = Options(requests=10, tokens=20_000)


@dataclass(frozen=True)
class Result:
    body_bytes: int
    kept_bytes: int
    """Traced bytes per routed request, its content kept."""
    sent_bytes: int
    """Traced bytes per routed request once ``Director.sent`` let its content go."""


def turns(n: int, tokens: int, seed: int) -> list[bytes]:
    """``n`` chat requests of one context of about ``tokens`` tokens, each with its own end."""
    context = words(random.Random(seed), tokens)
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"{context} and then q{i:04d}"}]
        body = {"model": MODEL, "messages": messages, "max_tokens": 1, "stream": True}
        out.append(orjson.dumps(body))
    return out


async def held(director: Director, bodies: Sequence[bytes], *, send: bool) -> list[Exchange]:
    """Route every body (and with ``send`` let its content go, as the server does once it
    answered); the exchanges, as the server keeps them while the answers stream."""
    kept = []
    for body in bodies:
        ex = director.begin(HEADERS)
        await director.route(ex, bytes(memoryview(body)), {})  # a copy, as the server's
        if send:
            director.sent(ex)
        kept.append(ex)
    return kept


async def traced_per_request(
    director: Director,
    bodies: Sequence[bytes],
    *,
    send: bool,
    caches: Sequence[ChainCache] = (),
) -> int:
    """Bytes ``tracemalloc`` counts per request that ``held`` keeps. ``caches`` are emptied
    before counting: the prefix producer's recent prompts (``ChainCache``) are a fixed amount
    however many requests are in flight, not something a request holds."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = await held(director, bodies, send=send)
        for cache in caches:
            cache.clear()
        gc.collect()
        total = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    del kept
    return total // len(bodies)


async def ready(director: Director, body: bytes) -> None:
    """Route ``body`` once discovery has run (and so index its prefix)."""
    for _ in range(_ROUTE_TRIES):
        try:
            await held(director, [body], send=True)
            return
        except Exception:
            await asyncio.sleep(0.05)
    raise RuntimeError("the EPP routed no request")


async def run(opts: Options) -> Result:
    bodies = turns(opts.requests + 1, opts.tokens, opts.seed)
    async with epp_app() as app:
        director = app.context.director
        caches = [getattr(p, "chains", None) for p in app.pipeline.producers]
        chains = [c for c in caches if isinstance(c, ChainCache)]
        await ready(director, bodies[0])
        kept = await traced_per_request(director, bodies[1:], send=False, caches=chains)
        sent = await traced_per_request(director, bodies[1:], send=True, caches=chains)
    return Result(sum(map(len, bodies[1:])) // opts.requests, kept, sent)


def table(result: Result, opts: Options) -> str:
    def mb(n: int) -> str:
        return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"

    return "\n".join(
        [
            f"{opts.requests} routed requests of about {opts.tokens:,} prompt tokens "
            f"(body {mb(result.body_bytes)}), held while their answers stream:",
            "",
            "| the request's content | held per request | x body |",
            "|---|---|---|",
            f"| kept until completion | {mb(result.kept_bytes)} "
            f"| {result.kept_bytes / result.body_bytes:.2f} |",
            f"| let go once sent on (`Director.sent`) | {mb(result.sent_bytes)} "
            f"| {result.sent_bytes / result.body_bytes:.3f} |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m epp_tools.bench.scale.retain",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="10 requests of 20,000 tokens (tests)")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    opts = QUICK if args.quick else Options()
    result = asyncio.run(run(opts))
    print(table(result, opts))
    if args.json is not None:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
