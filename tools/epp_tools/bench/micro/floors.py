"""``epp bench micro`` rows for the floors under two per-request-cost targets: what Python's
asyncio itself costs for the same traffic, with none of the EPP's work.

* ``echo``: a child process runs a bare ``asyncio.Protocol`` that answers every read with one
  60-byte write. ``STREAMS`` connections from this process each send a 120-byte message and
  wait for its answer, ``MESSAGES`` times in all. The child's CPU per message is the floor of
  one socket read, one write and one event-loop turn per message: the part of the `h2`
  server's cost per streamed chunk that is not its own work (its wire row minus its in-process
  row in ``epp bench micro``). Again with one connection (``LONE_MESSAGES``), each message the only
  one in flight: the floor under the wire row's "one message at a time".
* ``paced``: one connection, a message every ``PACE_S`` (as a token's chunk comes), answered or
  not: the server's CPU per message with and without its write. Unanswered is what an ext_proc
  stream in Envoy's observability mode (send and go) would cost: the part of a lone chunk's
  cost that not replying saves.
* ``scrape``: a child process sends ``GET /metrics`` every 50 ms on one keep-alive connection
  to each of 4 simulated pods (``epp sim``, as ``epp_tools.bench.micro.idle`` starts them) and reads
  the 4 answers (status line and headers, then a ``Content-Length`` body) without parsing them. Its
  CPU share over 10 s, after a 3 s warm-up, is the floor of the EPP's idle scraping of 4 pods
  (the idle row), whose collector also parses, stores and publishes what it reads.

CPU is every thread's scheduler run time (``/proc/<pid>/task/*/schedstat``). Run alone:
``python -m epp_tools.bench.micro.floors``.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from epp_tools.bench.micro.idle import context_switches, run_seconds, scrapes_answered, start_fleets

STREAMS = 32
MESSAGES = 25_600
LONE_MESSAGES = 6_400
PACED_MESSAGES = 3_000
PACE_S = 0.0005
_MESSAGE = b"m" * 120
_LAST = b"!" * 120
_REPLY = b"r" * 60
_INTERVAL = 0.05
_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


@dataclass(frozen=True)
class ScrapeFloor:
    share: float
    """CPU of the scraping process as a share of one core."""
    scrapes_per_s: float
    switches_per_scrape: float


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._transport.write(_REPLY)


class _Sink(_Echo):
    """Answers only the last message (so the client knows every one was read)."""

    def data_received(self, data: bytes) -> None:
        if data.endswith(_LAST):
            self._transport.write(_REPLY)


async def _serve_echo(protocol: type[_Echo] = _Echo) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes stdin
    server.close()


async def _scrape(hostports: list[tuple[str, int]]) -> None:
    """Every 50 ms: one GET on each connection, then every answer read whole."""
    conns = [await asyncio.open_connection(h, p) for h, p in hostports]
    request = b"GET /metrics HTTP/1.1\r\nHost: pod\r\n\r\n"
    loop = asyncio.get_running_loop()
    tick = loop.time()
    print("ready", flush=True)
    while True:
        for _, writer in conns:
            writer.write(request)
        for reader, _ in conns:
            head = await reader.readuntil(b"\r\n\r\n")
            found = _LENGTH.search(head)
            await reader.readexactly(int(found.group(1)) if found else 0)
        tick += _INTERVAL
        await asyncio.sleep(max(0.0, tick - loop.time()))


def _child(args: list[str]) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "epp_tools.bench.micro.floors", *args]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


async def _drive_echo(port: int, messages: int, streams: int = STREAMS) -> None:
    async def lane(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(n):
            writer.write(_MESSAGE)
            await reader.readexactly(len(_REPLY))
        writer.close()

    async with asyncio.timeout(300):
        await asyncio.gather(*(lane(messages // streams) for _ in range(streams)))


async def _drive_paced(port: int, messages: int, answered: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(300):
        for _ in range(messages - 1):
            writer.write(_MESSAGE)
            if answered:
                await reader.readexactly(len(_REPLY))
            time.sleep(PACE_S)  # blocking, on purpose: the next message comes after a pause
        writer.write(_LAST)
        await reader.readexactly(len(_REPLY))
    writer.close()


def _server_us_per_message(
    kind: str, messages: int, warmup: int, drive: Callable[[int, int], Coroutine[Any, Any, None]]
) -> float:
    """CPU µs per message of a child server (``echo`` or ``sink``) while ``drive(port, n)``
    sends it ``messages``, after ``warmup`` messages."""
    child = _child([kind])
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        asyncio.run(drive(port, warmup))
        t0 = run_seconds(child.pid)
        asyncio.run(drive(port, messages))
        return (run_seconds(child.pid) - t0) / messages * 1e6
    finally:
        child.kill()
        child.wait()


def paced_us_per_message(answered: bool, messages: int = PACED_MESSAGES) -> float:
    """CPU µs per message of a bare asyncio server sent a message every ``PACE_S``: answering
    each with one write (``answered``) or reading them only."""

    def drive(port: int, n: int) -> Coroutine[Any, Any, None]:
        return _drive_paced(port, n, answered)

    kind = "echo" if answered else "sink"
    return _server_us_per_message(kind, messages, max(2, messages // 10), drive)


def echo_us_per_message(messages: int = MESSAGES, streams: int = STREAMS) -> float:
    """CPU µs per message of a bare asyncio server answering each read with one write; with
    ``streams=1`` each message is the only one in flight, so every read wakes the server."""

    def drive(port: int, n: int) -> Coroutine[Any, Any, None]:
        return _drive_echo(port, n, streams)

    return _server_us_per_message("echo", messages, messages // 10, drive)


def scrape_floor(pods: int = 4, *, seconds: float = 10.0, warmup: float = 3.0) -> ScrapeFloor:
    """CPU share of a bare asyncio process scraping ``pods`` simulated pods every 50 ms."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        fleets = start_fleets(pods, Path(tmp), stack)
        hostports = [f"{h}:{p}" for f in fleets for h, p in f.hostports]
        child = _child(["scrape", *hostports])
        try:
            assert child.stdout is not None
            child.stdout.readline()
            time.sleep(warmup)
            s0, c0, t0 = scrapes_answered(fleets), run_seconds(child.pid), time.monotonic()
            x0 = context_switches(child.pid)
            time.sleep(seconds)
            elapsed = time.monotonic() - t0
            scrapes = scrapes_answered(fleets) - s0
            share = (run_seconds(child.pid) - c0) / elapsed
            switches = context_switches(child.pid) - x0
        finally:
            child.kill()
            child.wait()
    return ScrapeFloor(share, scrapes / elapsed, switches / max(1, scrapes))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("echo", "sink"):
        asyncio.run(_serve_echo(_Echo if args[0] == "echo" else _Sink))
    elif args and args[0] == "scrape":
        pairs = [a.rsplit(":", 1) for a in args[1:]]
        asyncio.run(_scrape([(h, int(p)) for h, p in pairs]))
    else:
        print(f"asyncio echo floor: {echo_us_per_message():.1f} µs CPU per message")
        floor = scrape_floor()
        print(
            f"asyncio scrape floor, 4 pods every 50 ms: {floor.share * 100:.2f}% of a core, "
            f"{floor.scrapes_per_s:.0f} scrapes/s, {floor.switches_per_scrape:.2f} switches/scrape"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
