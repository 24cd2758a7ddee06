"""Where the EPP's Python work per message goes, counted rather than timed: the bytecodes each
function runs per streamed response chunk and per one-chunk request, in ``chunkcost``'s harness
(a whole EPP, its ext_proc connection fed frames in process, no socket).

``sys.settrace`` with opcode events counts every bytecode of every Python function called while
the frames are fed; a count is the same on a busy machine and a quiet one, so it tells what a
change removes where timings drown in the noise. Tracing slows the process a hundredfold: the
counts, not the time, are the result.

    python -m epp_tools.bench.micro.bytecodes                # both tables
    python -m epp_tools.bench.micro.bytecodes --chunks 2000 --requests 300 --top 30

``--feed-only N`` (``--build-only N``) runs the chunk harness with ``N`` chunks fed (only built)
and no tracing, for an instruction count of the whole process under ``valgrind
--tool=callgrind``: the difference between two ``N`` of ``--feed-only``, less the same for
``--build-only``, is the instructions per chunk (docs/benchmarks.md, "Where a chunk's
instructions go").
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from epp.eventloop import EVENT_LOOPS, run
from epp.server.context import ServerContext
from epp_tools.bench.micro import chunkcost

Site = tuple[str, str]
"""(file, function): the file relative to the checkout or to site-packages."""

_ROOTS = (str(Path(__file__).resolve().parents[4]) + "/", "site-packages/")


def _site(frame: FrameType) -> Site:
    name = frame.f_code.co_filename
    for root in _ROOTS:
        if root in name:
            name = name.split(root, 1)[1]
    return name, frame.f_code.co_name


@dataclass
class Counts:
    """Bytecodes and calls per function over ``units`` chunks or requests."""

    units: int
    bytecodes: Counter[Site]
    calls: Counter[Site]

    @property
    def bytecodes_per_unit(self) -> float:
        return sum(self.bytecodes.values()) / self.units

    @property
    def calls_per_unit(self) -> float:
        return sum(self.calls.values()) / self.units

    def by_file(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for (file, _), n in self.bytecodes.items():
            out[file] += n
        return out


class _Tracer:
    def __init__(self) -> None:
        self.bytecodes: Counter[Site] = Counter()
        self.calls: Counter[Site] = Counter()

    def on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or frame.f_code.co_filename == __file__:  # the feeding loop itself
            return None
        self.calls[_site(frame)] += 1
        frame.f_trace_opcodes = True
        return self.on_opcode

    def on_opcode(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            self.bytecodes[_site(frame)] += 1
        return self.on_opcode


async def _traced(units: int, work: Callable[[], Awaitable[Any]]) -> Counts:
    tracer = _Tracer()
    sys.settrace(tracer.on_call)
    try:
        await work()
    finally:
        sys.settrace(None)
    return Counts(units, tracer.bytecodes, tracer.calls)


async def count_chunks(ctx: ServerContext, chunks: int) -> Counts:
    """Bytecodes per streamed chunk: one routed stream fed ``chunks`` chunks, one frame each."""
    stream = await chunkcost.chunk_stream(ctx, chunks)
    counts = await _traced(chunks, lambda: _feed(stream))
    if stream.sid not in stream.conn.streams:
        raise RuntimeError("the stream ended before its chunks did")
    stream.conn.connection_lost(None)
    return counts


async def _feed(stream: chunkcost.ChunkStream) -> None:
    for frame in stream.frames:
        stream.conn.data_received(frame)


async def count_requests(ctx: ServerContext, requests: int) -> Counts:
    """Bytecodes per one-chunk request (``chunkcost.per_request``'s streams, its timer too)."""
    return await _traced(requests, lambda: chunkcost.per_request(ctx, requests))


async def _measure(chunks: int, requests: int) -> tuple[Counts, Counts]:
    async with chunkcost.epp() as ctx:
        await chunkcost.per_chunk(ctx, 200)  # warm up: caches, lazily built tables
        await chunkcost.per_request(ctx, 100)
        return await count_chunks(ctx, chunks), await count_requests(ctx, requests)


def measure(chunks: int = 1000, requests: int = 300) -> tuple[Counts, Counts]:
    """(per chunk, per request) counts, on the EPP's default event loop."""
    return run(_measure(chunks, requests), EVENT_LOOPS[0])


def table(title: str, counts: Counts, top: int) -> list[str]:
    lines = [
        f"{title}: {counts.bytecodes_per_unit:,.0f} bytecodes in "
        f"{counts.calls_per_unit:,.1f} Python calls",
        "| bytecodes | calls | function |",
        "|---:|---:|---|",
    ]
    for site, n in counts.bytecodes.most_common(top):
        file, fn = site
        lines.append(f"| {n / counts.units:,.1f} | {counts.calls[site] / counts.units:.2f} "
                     f"| {file}:{fn} |")  # fmt: skip
    lines += ["", "| bytecodes | file |", "|---:|---|"]
    for file, n in counts.by_file().most_common(top):
        lines.append(f"| {n / counts.units:,.1f} | {file} |")
    return lines


async def _callgrind_body(chunks: int, feed: bool) -> None:
    async with chunkcost.epp() as ctx:
        await chunkcost.per_chunk(ctx, 200)
        stream = await chunkcost.chunk_stream(ctx, chunks)
        if feed:
            await _feed(stream)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m epp_tools.bench.micro.bytecodes")
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--top", type=int, default=25, help="rows of each table")
    once = parser.add_mutually_exclusive_group()
    once.add_argument("--feed-only", type=int, metavar="N", help="callgrind: feed N chunks")
    once.add_argument("--build-only", type=int, metavar="N", help="callgrind: build N chunks")
    args = parser.parse_args(argv)
    for value in (args.chunks, args.requests, args.top, args.feed_only, args.build_only):
        if value is not None and value < 1:
            parser.error("counts must be at least 1")
    logging.disable(logging.WARNING)
    if args.feed_only or args.build_only:
        body = _callgrind_body(args.feed_only or args.build_only, bool(args.feed_only))
        run(body, EVENT_LOOPS[0])
        return 0
    chunk, request = measure(args.chunks, args.requests)
    print("\n".join(table("per streamed chunk", chunk, args.top)))
    print()
    print("\n".join(table("per one-chunk request", request, args.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
