"""A running EPP trims its C heap every ``--memory-trim-interval`` (``HeapTrimmer``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from epp.observability import memory


@pytest.mark.skipif(memory._libc() is None, reason="malloc_trim is glibc's; this libc has none")
async def test_the_app_trims_every_interval_and_not_when_off(start_app: Callable[..., Any]) -> None:
    off = await start_app([], ready=False, memory_trim_interval=0.0)
    app = await start_app([], ready=False, memory_trim_interval=0.05)
    for _ in range(200):  # bounded: 10 s at most
        if app.heap_trimmer.trims >= 2:
            break
        await asyncio.sleep(0.05)
    assert app.heap_trimmer.trims >= 2
    assert off.heap_trimmer.trims == 0  # it ran all that time beside the other
