"""Where memory goes, for leak hunting on the metrics port (``/debug/runtime`` query options).

Python-level allocations: start the EPP with ``PYTHONTRACEMALLOC=<frames>`` (or
``python -X tracemalloc=<frames>``); Python then records the allocation site of every block,
which costs CPU and memory, so it is for a debugging run only. Without it nothing here runs and
nothing is recorded: ``/debug/runtime`` costs what it did. With it:

- ``/debug/runtime`` adds ``tracemalloc``: the bytes Python's allocators hold now and at peak
  (``tracedBytes``, ``peakBytes``). RSS growing while ``tracedBytes`` stays flat is growth below
  Python (the C allocator's fragmentation, or a C extension such as gRPC core);
- ``/debug/runtime?tracemalloc=baseline`` takes a snapshot and keeps it as the baseline (one
  snapshot: a new baseline replaces the old one);
- ``/debug/runtime?tracemalloc=diff[&top=N]`` answers the ``N`` allocation sites (file:line,
  default 25, at most 100) whose held bytes changed the most since the baseline, each with its
  size and block count now and their change.

C heap (glibc only; elsewhere ``heap`` is absent): ``/debug/runtime?heap=1`` adds ``heap``, from
``mallinfo2()``: bytes the allocator has from the system (``arenaBytes`` from the main heap and
the thread arenas, ``mmapBytes`` in large blocks), in use by the program (``inUseBytes``) and
free inside its heaps (``freeBytes``: held but not returned, fragmentation when it grows).
``?heap=trim`` first calls ``malloc_trim(0)``, which hands the free pages of every arena back to
the system, and adds ``trimmed`` (whether it released any): RSS before and after tells how much
of it was free memory the allocator held.

Python's small-object allocator (objects up to 512 bytes, in 1 MiB arenas of 16 KiB pools):
``?pymalloc=1`` adds ``pymalloc``, parsed from ``sys._debugmallocstats()``: arenas now, at their
high-water mark and reclaimed so far (an arena goes back to the system only when all its blocks
are free), and the bytes in allocated blocks, in free blocks of used pools, and in unused pools.
Arenas growing while the allocated bytes stay flat is fragmentation: a few long-lived objects
keep mostly empty arenas. (The stats are printed to descriptor 2, which is pointed at a
temporary file for the call; the GIL is held throughout, so no Python log line goes there.)

Returning the free heap (``HeapTrimmer``, ``--memory-trim-interval``, default 60s): glibc keeps
the memory of freed blocks below its mmap threshold in its heaps for reuse, and after a large
block is freed it raises that threshold (up to 32 MiB), so a request body of a few hundred KB,
its parsed text and its token ids come from the heap too. Their pages stay resident once freed:
with long agent prompts in flight a third of the EPP's RSS was free heap (120 of 320 MB at 3,000
agents), and RSS is what a memory limit counts. Every interval the trimmer calls
``malloc_trim(0)`` in a thread (it takes each arena's lock in turn; the event loop keeps running),
which hands the free pages of every arena back to the system, as Go's scavenger does for llm-d's
EPP: what a burst left free goes back within an interval. Under steady load the heap fills back
to its working size between trims (a page used again costs a page fault), so a peak stays what
it was. Where there is no glibc it does nothing.

Python's cyclic garbage collector: ``?gc=1`` adds ``gc`` (objects it tracks per generation, and
the collections, collected and uncollectable objects so far per generation); ``?gc=collect``
first runs a full collection and adds the objects it found unreachable (``collected``): garbage
that only a full collection frees, which RSS carries until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import os
import re
import sys
import tempfile
import tracemalloc
from typing import Any

MAX_TOP = 100
DEFAULT_TOP = 25


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )
    ]  # fmt: skip


def _libc() -> Any:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = (ctypes.c_size_t,)
        return libc
    return None


def rss_bytes() -> int:
    """This process's resident set, from ``/proc/self/statm`` (0 where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Hands the C heap's free pages back to the system every ``interval`` seconds (module
    docstring); ``trim`` is glibc's ``malloc_trim``, found when ``None``. ``released`` counts the
    RSS the trims gave back, ``trims`` the trims done."""

    def __init__(self, interval: float, trim: Any = None) -> None:
        self.interval = interval
        self._trim = trim
        self.trims = 0
        self.released = 0

    async def run(self) -> None:
        """Trim every ``interval`` until cancelled; returns at once when off or without glibc."""
        trim = self._trim
        if trim is None:
            libc = _libc()
            trim = getattr(libc, "malloc_trim", None) if libc else None
        if trim is None or self.interval <= 0:
            return
        while True:
            await asyncio.sleep(self.interval)
            await self.trim_once(trim)

    async def trim_once(self, trim: Any) -> int:
        """One trim, off the event loop: the RSS it gave back (bytes, at least 0)."""
        before = rss_bytes()
        await asyncio.to_thread(trim, 0)
        released = max(0, before - rss_bytes())
        self.trims += 1
        self.released += released
        return released


class MemoryDebug:
    """One App's tracemalloc baseline and the ``/debug/runtime`` memory views."""

    def __init__(self) -> None:
        self._baseline: tracemalloc.Snapshot | None = None
        self._libc: Any = None

    def summary(self) -> dict[str, int] | None:
        """Traced bytes now and at peak, ``None`` when tracemalloc is not tracing."""
        if not tracemalloc.is_tracing():
            return None
        current, peak = tracemalloc.get_traced_memory()
        return {"tracedBytes": current, "peakBytes": peak}

    def heap(self, trim: bool = False) -> dict[str, int] | None:
        """glibc's ``mallinfo2()`` (after ``malloc_trim(0)`` when ``trim``); ``None`` where there
        is none."""
        if self._libc is None:
            self._libc = _libc() or False
        if not self._libc:
            return None
        trimmed = {"trimmed": int(self._libc.malloc_trim(0))} if trim else {}
        info = self._libc.mallinfo2()
        return trimmed | {
            "arenaBytes": int(info.arena),
            "mmapBytes": int(info.hblkhd),
            "inUseBytes": int(info.uordblks) + int(info.hblkhd),
            "freeBytes": int(info.fordblks),
        }

    def pymalloc(self) -> dict[str, int]:
        """obmalloc's arenas and bytes (``{}`` where ``sys._debugmallocstats`` is missing)."""
        stats = getattr(sys, "_debugmallocstats", None)
        if stats is None:
            return {}
        with tempfile.TemporaryFile() as out:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(out.fileno(), 2)
                stats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            out.seek(0)
            return _parse_mallocstats(out.read().decode(errors="replace"))

    def gc(self, collect: bool = False) -> dict[str, Any]:
        """The collector's generations and totals, after a full collection when ``collect``."""
        out: dict[str, Any] = {"collected": gc.collect()} if collect else {}
        return out | {
            "tracked": [len(gc.get_objects(generation)) for generation in range(3)],
            "stats": gc.get_stats(),
        }

    def command(self, action: str, top: int = DEFAULT_TOP) -> dict[str, Any]:
        """``baseline`` or ``diff``; raises ValueError with what to do otherwise."""
        if not tracemalloc.is_tracing():
            raise ValueError("tracemalloc is off: start the EPP with PYTHONTRACEMALLOC=1")
        if action == "baseline":
            self._baseline = _snapshot()
            return {"baseline": True, "traces": len(self._baseline.traces)}
        if action != "diff":
            raise ValueError("tracemalloc must be 'baseline' or 'diff'")
        if self._baseline is None:
            raise ValueError("no baseline: ask for ?tracemalloc=baseline first")
        if not 1 <= top <= MAX_TOP:
            raise ValueError(f"top must be within 1..{MAX_TOP}")
        stats = _snapshot().compare_to(self._baseline, "lineno")
        return {
            "sizeDiffBytes": sum(s.size_diff for s in stats),
            "top": [
                {
                    "site": f"{s.traceback[0].filename}:{s.traceback[0].lineno}",
                    "bytes": s.size,
                    "bytesDiff": s.size_diff,
                    "blocks": s.count,
                    "blocksDiff": s.count_diff,
                }
                for s in stats[:top]
            ],
        }


_MALLOCSTATS = {
    "arenas": r"# arenas allocated current\s*=\s*([\d,]+)",
    "arenasHighWater": r"# arenas highwater mark\s*=\s*([\d,]+)",
    "arenasReclaimed": r"# arenas reclaimed\s*=\s*([\d,]+)",
    "allocatedBytes": r"# bytes in allocated blocks\s*=\s*([\d,]+)",
    "freeBlockBytes": r"# bytes in available blocks\s*=\s*([\d,]+)",
    "unusedPoolBytes": r"unused pools \* \d+ bytes\s*=\s*([\d,]+)",
}


def _parse_mallocstats(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, pattern in _MALLOCSTATS.items():
        found = re.search(pattern, text)
        if found:
            out[key] = int(found.group(1).replace(",", ""))
    return out


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),)
    )
