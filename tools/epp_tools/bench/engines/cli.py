"""``epp bench engines``: the ext_proc server's CPU per streamed chunk and per request on each
HTTP/2 engine it could run on, side by side in one run.

Engines, each under the same calls (``Call`` / ``CallIO`` of ``epp.server.h2conn``):

* ``ngh2``: libnghttp2 through ``ngh2``, what the server runs (``epp.server.h2conn``);
* ``h2``: hyper's pure-Python ``h2`` (``epp_tools.bench.engines.h2hyper``);
* ``hand-written``: the framing the server ran on before (``epp_tools.bench.engines.h2baseline``).

Rows per engine, in this process with a transport that only counts bytes (no socket, no
event-loop turn per message; the asyncio floor of ``epp bench micro`` adds about that much
through a real socket):

* ``engine, echo call``: µs of CPU per message pair with a call that answers each 120-byte
  message with a 60-byte one, nothing else: the engine's own cost per streamed chunk;
* ``EPP, per chunk``: a whole EPP (``epp_tools.bench.micro.chunkcost``) serving one stream's
  response chunks: the cost per streamed chunk the EPP receives;
* ``EPP, per request``: the whole EPP serving requests of one chunk each, one after another:
  request headers, body (routed), response headers, the chunk.

Each figure is the median of ``--rounds`` rounds; the rounds visit the engines in turn, so a
change of the machine's load falls on all of them. The ratio column divides by the
hand-written engine's figure. Nothing is asserted: this is a measuring tool::

    epp bench engines [--chunks 20000] [--requests 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server.h2conn import CallIO, Connection
from epp_tools.bench.engines import h2baseline, h2hyper
from epp_tools.bench.micro import chunkcost, wire

ENGINES: dict[str, chunkcost.Factory] = {
    "ngh2": Connection,
    "h2": h2hyper.HyperConnection,
    "hand-written": h2baseline.Connection,
}
BASELINE = "hand-written"
ECHO, CHUNK, REQUEST = "engine, echo call", "EPP, per chunk", "EPP, per request"


@dataclass(frozen=True)
class Row:
    engine: str
    step: str
    us: float
    ratio: float


class _Echo:
    def __init__(self, io: CallIO, reply: bytes) -> None:
        self.io, self.reply = io, reply

    def on_message(self, data: bytes) -> None:
        self.io.send(self.reply)

    def on_half_close(self) -> None:
        self.io.finish(0)

    def on_reset(self) -> None:
        pass


def echo_us(factory: chunkcost.Factory, messages: int) -> float:
    """µs of CPU per message answered by a call that does nothing else."""
    reply = pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString()
    reply += bytes(max(0, 60 - len(reply)))
    conn = chunkcost.connect(factory, lambda path, io: _Echo(io, reply))
    client = chunkcost.Client()
    chunk = wire.stream_messages(1)[3].SerializeToString()
    conn.data_received(client.headers(1))
    frames = [client.message(1, chunk) for _ in range(messages)]
    t0 = time.process_time()
    for frame in frames:
        conn.data_received(frame)
    spent = time.process_time() - t0
    conn.connection_lost(None)
    return spent / messages * 1e6


async def _round(chunks: int, requests: int) -> dict[tuple[str, str], float]:
    out = {}
    async with chunkcost.epp() as ctx:
        for name, factory in ENGINES.items():
            out[name, ECHO] = echo_us(factory, chunks)
            out[name, CHUNK] = await chunkcost.per_chunk(ctx, chunks, factory)
            out[name, REQUEST] = await chunkcost.per_request(ctx, requests, factory)
    return out


def measure(chunks: int = 20_000, requests: int = 2_000, rounds: int = 5) -> list[Row]:
    """Median µs of each engine and step over ``rounds`` rounds (see the module docstring)."""
    asyncio.run(_round(chunks // 10, requests // 10))  # warm up
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        for key, us in asyncio.run(_round(chunks, requests)).items():
            samples.setdefault(key, []).append(us)
    median = {key: statistics.median(v) for key, v in samples.items()}
    return [
        Row(name, step, median[name, step], median[name, step] / median[BASELINE, step])
        for step in (ECHO, CHUNK, REQUEST)
        for name in ENGINES
    ]


def table(rows: Sequence[Row], chunks: int, requests: int, rounds: int) -> str:
    head = f"{'step':<22}{'engine':<16}{'µs CPU':>10}{'ratio':>10}"
    lines = [
        f"HTTP/2 engines, median of {rounds} rounds ({chunks} chunks, {requests} requests each;"
        f" ratio: to {BASELINE})",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lines.append(f"{r.step:<22}{r.engine:<16}{r.us:>10.2f}{r.ratio:>10.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, out: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(
        prog="epp bench engines",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--chunks", type=int, default=20_000, help="chunks per round (default 20000)")
    p.add_argument("--requests", type=int, default=2_000, help="requests per round (default 2000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    args = p.parse_args(argv)
    if min(args.chunks, args.requests, args.rounds) < 1:
        p.error("--chunks, --requests and --rounds must be >= 1")
    logging.basicConfig(level=logging.WARNING)
    rows = measure(args.chunks, args.requests, args.rounds)
    out(table(rows, args.chunks, args.requests, args.rounds))
    return 0
