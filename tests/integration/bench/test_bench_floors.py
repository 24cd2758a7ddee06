"""``epp_tools.bench.micro.floors``: the bare-asyncio floors under the per-chunk and idle-scraping
rows run against real processes and report what they measured."""

from __future__ import annotations

import pytest

from epp_tools.bench.micro import floors

pytestmark = [pytest.mark.timeout(300)]


def test_the_echo_floor_answers_every_message_and_counts_the_servers_cpu() -> None:
    us = floors.echo_us_per_message(messages=floors.STREAMS * 40)
    assert 0.0 < us < 10_000.0


def test_the_lone_echo_floor_answers_each_message_before_the_next_is_sent() -> None:
    us = floors.echo_us_per_message(messages=200, streams=1)
    assert 0.0 < us < 10_000.0


@pytest.mark.parametrize("answered", [True, False], ids=["answered", "read-only"])
def test_the_paced_floor_waits_until_the_server_read_every_message(answered: bool) -> None:
    # the last message is answered either way: without reading it the client would wait
    # for the 300 s bound, not return
    us = floors.paced_us_per_message(answered, messages=40)
    assert 0.0 < us < 10_000.0


def test_the_scrape_floor_reads_whole_answers_from_simulated_pods() -> None:
    floor = floors.scrape_floor(pods=2, seconds=1.0, warmup=0.5)
    # 2 pods every 50 ms: about 40 scrapes a second; a loaded machine may reach fewer, but a
    # client that misread an answer (and so stalled on the next) would reach almost none
    assert floor.scrapes_per_s > 5.0, floor
    assert 0.0 < floor.share < 1.0 and floor.switches_per_scrape > 0.0, floor
