"""The collector's tick grid: endpoints share phases, so a few endpoints cost one timer wake-up
per tick, and many endpoints spread over the interval in groups."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

from epp.datalayer.collector import SLOT_SIZE, Collector, SourcePipeline
from epp.datalayer.store import Datastore
from epp.plugin import Endpoint, TypedName
from tests.builders import make_endpoint

INTERVAL = 0.05


class _Recorder:
    """A data source that records, per endpoint, the event-loop iteration of each poll."""

    typed_name = TypedName("recorder", "recorder")

    def __init__(self) -> None:
        self.polls: dict[str, list[int]] = defaultdict(list)
        self.iteration = 0

    def count_iterations(self) -> None:
        """Called once per loop iteration (it schedules itself again for the next one)."""
        self.iteration += 1
        asyncio.get_running_loop().call_soon(self.count_iterations)

    async def poll(self, endpoint: Endpoint) -> bytes:
        self.polls[endpoint.id].append(self.iteration)
        return b""


async def _record(endpoints: int, polls: int) -> dict[str, list[int]]:
    store = Datastore(time.monotonic)
    store.set_endpoints([make_endpoint(i) for i in range(endpoints)])
    source = _Recorder()
    collector = Collector(
        store=store,
        pipelines=[SourcePipeline.of(source, [])],
        interval=INTERVAL,
        clock=time.monotonic,
        on_poll_error=lambda *_: None,
        on_extract_error=lambda *_: None,
    )
    source.count_iterations()
    task = asyncio.create_task(collector.run())
    try:
        async with asyncio.timeout(10):
            while min((len(p) for p in source.polls.values()), default=0) < polls:
                await asyncio.sleep(INTERVAL)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(source.polls) == endpoints
    return source.polls


async def test_few_endpoints_poll_in_one_wakeup_after_their_first_poll() -> None:
    polls = await _record(4, 5)
    for tick in range(1, 5):
        assert len({iterations[tick] for iterations in polls.values()}) == 1


async def test_many_endpoints_spread_over_the_interval_in_groups() -> None:
    polls = await _record(4 * SLOT_SIZE, 6)
    # Four phases. A loop that ran late polls the phases whose times passed in one wake-up, so
    # on a busy machine one tick can merge them; the tick that spread most must show the groups.
    ticks = [Counter(iterations[tick] for iterations in polls.values()) for tick in range(1, 6)]
    groups = max(ticks, key=len)
    assert 2 <= len(groups) <= 4
    assert max(groups.values()) <= 2 * SLOT_SIZE
