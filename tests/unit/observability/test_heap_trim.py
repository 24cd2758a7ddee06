"""``HeapTrimmer`` (``--memory-trim-interval``): the C heap's free pages go back to the system."""

from __future__ import annotations

import asyncio
import threading

import pytest

from epp.observability import memory
from epp.observability.memory import HeapTrimmer, rss_bytes


class FakeTrim:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (pad, thread id)

    def __call__(self, pad: int) -> int:
        self.calls.append((pad, threading.get_ident()))
        return 1


async def test_trims_every_interval_off_the_event_loop_thread_until_cancelled() -> None:
    fake = FakeTrim()
    trimmer = HeapTrimmer(0.01, trim=fake)
    task = asyncio.create_task(trimmer.run())
    for _ in range(500):  # bounded: 5 s at most
        if len(fake.calls) >= 3:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(fake.calls) >= 3 and trimmer.trims == len(fake.calls)
    assert all(pad == 0 for pad, _ in fake.calls)
    assert threading.get_ident() not in {tid for _, tid in fake.calls}


async def test_an_interval_of_zero_never_trims() -> None:
    fake = FakeTrim()
    await asyncio.wait_for(HeapTrimmer(0.0, trim=fake).run(), 1.0)
    assert fake.calls == []


def _glibc_trim() -> object | None:
    libc = memory._libc()
    return getattr(libc, "malloc_trim", None) if libc else None


@pytest.mark.skipif(_glibc_trim() is None, reason="malloc_trim is glibc's; this libc has none")
async def test_a_trim_gives_back_the_pages_of_freed_blocks_between_live_ones() -> None:
    # 64 KiB blocks come from the heap (below glibc's mmap threshold); freeing every other one
    # leaves holes glibc keeps, and only a trim hands their pages back.
    blocks = [bytes(64 * 1024 - 64) + bytes([i % 256]) for i in range(1024)]
    held = blocks[1::2]
    del blocks
    before = rss_bytes()
    released = await HeapTrimmer(60.0).trim_once(_glibc_trim())
    assert before > 0
    assert released >= 8 * 2**20, f"a trim released {released} bytes"
    assert len(held) == 512  # the live half is still there
