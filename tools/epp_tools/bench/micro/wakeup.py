"""``epp bench micro`` rows: what the same work costs when the process has just woken up.

The in-process rows time thousands of chunks back to back, with the CPU's caches and branch
predictors warm. Behind Envoy a message usually arrives after the process slept, and on a virtual
machine whatever ran in between (the host, or the guest's own timer) has cold-started the core:
the same instructions then cost several times more. These rows measure that factor, per sample
the thread CPU time (``time.thread_time_ns``) of one piece of work run after the process slept
``gap`` (``time.sleep``), median of ``SAMPLES``:

* ``chunk``: the EPP's work on one streamed response chunk, in process with no socket (the harness
  of ``epp_tools.bench.micro.chunkcost``: a whole EPP, a routed stream, one DATA frame fed per
  ``data_received`` call);
* ``loop``: a fixed loop of 300 integer additions in pure Python, which touches almost no data:
  the machine's own factor, whatever the EPP does.

With no gap both run back to back, as the in-process rows do. Run alone:
``python -m epp_tools.bench.micro.wakeup``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from epp_tools.bench.micro import chunkcost

GAPS_S: tuple[float, ...] = (0.0, 0.0005, 0.002, 0.01)
SAMPLES = 100


@dataclass(frozen=True)
class WakeupCost:
    gap_s: float
    chunk_us: float  # median thread CPU of one chunk's work after sleeping gap_s
    loop_us: float  # the same for the fixed pure-Python loop


def _loop() -> int:
    total = 0
    for i in range(300):
        total += i
    return total


def _after_sleep(work: Callable[[], object], gap_s: float, samples: int) -> float:
    """Median µs of thread CPU of ``work`` run right after sleeping ``gap_s``."""
    spent = []
    for _ in range(samples):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.thread_time_ns()
        work()
        spent.append(time.thread_time_ns() - t0)
    return statistics.median(spent) / 1000.0


async def _measure(gaps: tuple[float, ...], samples: int) -> list[WakeupCost]:
    async with chunkcost.epp() as ctx:
        chunks = samples * len(gaps) + samples  # the first `samples` only warm up
        conn, transport, sid, frame_list = await chunkcost.chunk_stream(ctx, chunks)
        frames = iter(frame_list)
        writes = transport.writes

        def chunk() -> None:
            conn.data_received(next(frames))

        _after_sleep(chunk, 0.0, samples)
        costs = [
            WakeupCost(gap, _after_sleep(chunk, gap, samples), _after_sleep(_loop, gap, samples))
            for gap in gaps
        ]
        if sid not in conn.streams:
            raise RuntimeError("the stream ended before its chunks did")
        if transport.writes - writes != chunks:  # each chunk's reply goes out in its own write
            raise RuntimeError(f"{chunks} chunks got {transport.writes - writes} writes")
        conn.connection_lost(None)
        return costs


def measure(gaps: tuple[float, ...] = GAPS_S, samples: int = SAMPLES) -> list[WakeupCost]:
    """One cost per gap (see the module docstring)."""
    return asyncio.run(_measure(gaps, samples))


if __name__ == "__main__":
    for cost in measure():
        print(f"after {cost.gap_s * 1000:g} ms: chunk {cost.chunk_us:.1f} µs, "
              f"loop {cost.loop_us:.1f} µs")  # fmt: skip
