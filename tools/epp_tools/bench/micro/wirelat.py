"""``epp bench micro`` rows for the ext_proc wire's latency: the wall-clock time of each round
trip Envoy waits for before a small streamed answer's first token reaches the client.

The server runs in a child process as for the CPU rows (``epp_tools.bench.micro.wire``: the whole
EPP, or the empty grpc.aio servicer, grpcio's floor). This process is a
grpc.aio client on one kept-alive channel with one stream at a time, as a lone request meets the
EPP, and times per request, in order:

* **route**: request headers and a ~300-byte body with end of stream written, until both replies
  are read (the EPP's, sent together once it routed: the headers' with the routing decision and
  the body's; the empty servicer answers each message as it comes, so its figure is two round
  trips);
* **response headers**: the upstream's response headers written, until their reply is read;
* **first chunk**: one 100-byte SSE chunk written, until its reply is read (a second chunk then
  ends the stream, untimed: the stream's completion work comes after the first token).

Medians of ``n`` requests (after a warm-up). The client's own cost is inside every figure (the
empty servicer's rows show it with grpc.aio's), so compare servers within one run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from epp.server import extproc_rpc
from epp_tools.bench.micro import wire

VARIANTS = (
    wire.Variant("empty servicer, grpc.aio", "empty-aio"),
    wire.Variant("EPP", "epp"),
)
PHASES = ("route", "response headers", "first chunk")


@dataclass(frozen=True)
class RoundTrips:
    variant: wire.Variant
    median_us: dict[str, float]


async def _one(process: Any) -> list[float]:
    headers, body, resp, chunk, last = wire.stream_messages(2)
    call = process()
    t0 = time.perf_counter()
    await call.write(headers)
    await call.write(body)
    for _ in range(2):  # reading one left the EPP's body reply for the next phase to find
        await call.read()
    t1 = time.perf_counter()
    await call.write(resp)
    await call.read()
    t2 = time.perf_counter()
    await call.write(chunk)
    await call.read()
    t3 = time.perf_counter()
    await call.write(last)  # the end of stream, untimed: the stream's completion work
    await call.done_writing()
    while await call.read() is not grpc.aio.EOF:  # the stream's end (bounded by the timeout)
        pass
    return [t1 - t0, t2 - t1, t3 - t2]


async def _measure(port: int, cert: bytes | None, n: int) -> dict[str, float]:
    async with wire.channel(port, cert) as ch:
        process = extproc_rpc.process(ch)
        async with asyncio.timeout(300):
            for _ in range(10):  # warm up: the connection, imports, caches
                await _one(process)
            samples = [await _one(process) for _ in range(n)]
    return {phase: statistics.median(s[i] for s in samples) * 1e6 for i, phase in enumerate(PHASES)}


def measure(variants: Sequence[wire.Variant] = VARIANTS, n: int = 300) -> list[RoundTrips]:
    out = []
    for v in wire.available(variants):
        with wire.serve(v) as (_, port, cert):
            medians = asyncio.run(_measure(port, cert, n))
        out.append(RoundTrips(v, medians))
    return out
