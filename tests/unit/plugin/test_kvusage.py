"""``epp.plugin.kvusage``: a pod's KV use as of now, and the tokens this EPP has in flight there."""

from __future__ import annotations

import dataclasses
from collections import deque

import pytest

from epp.plugin import Endpoint, kvusage
from epp.plugin.kvusage import KVTracker, capacity_tokens, demand_now, usage_now
from tests.builders import make_endpoint

BLOCKS, BLOCK = 1000, 16  # 16,000 tokens
T0 = 100.0


def _ep(kv: float, scraped_at: float = T0) -> Endpoint:
    ep = make_endpoint(0, kv=kv, update_time=scraped_at)
    assert ep.metrics is not None
    metrics = dataclasses.replace(ep.metrics, cache_num_blocks=BLOCKS, cache_block_size=BLOCK)
    return dataclasses.replace(ep, metrics=metrics)


def test_change_is_recomputed_only_when_a_record_or_the_scrape_time_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = KVTracker()
    tracker.dispatch("a", "ep", T0 - 1, 1000)
    tracker.dispatch("b", "ep", T0 + 1, 400)
    tracker.complete("a", T0 + 2, 1100)
    walked: list[float] = []
    real = kvusage._drop_until

    def counting(done: deque[tuple[float, float, int]], until: float) -> None:
        walked.append(until)
        real(done, until)

    monkeypatch.setattr(kvusage, "_drop_until", counting)
    assert tracker.change("ep", T0) == 400 - 1100
    assert tracker.change("ep", T0) == -700 and len(walked) == 1  # kept, not walked again
    tracker.dispatch("c", "ep", T0 + 3, 50)
    assert tracker.change("ep", T0) == -650 and len(walked) == 2
    assert tracker.change("ep", T0 + 2.5) == 50  # a newer scrape saw "a" end and "b" start
    assert tracker.in_flight("ep") == 450


def test_demand_counts_requests_in_flight_the_scrape_does_not_show_yet() -> None:
    tracker = KVTracker()
    ep = _ep(kv=0.10)
    assert capacity_tokens(ep) == 16_000
    # two requests sent before the scrape still wait in the server's queue: not in its usage
    tracker.dispatch("a", ep.id, T0 - 0.5, 6_000)
    tracker.dispatch("b", ep.id, T0 - 0.4, 6_000)
    assert usage_now(ep, T0 + 0.1, tracker) == pytest.approx(0.10)
    assert demand_now(ep, T0 + 0.1, tracker) == pytest.approx(0.75)
    tracker.dispatch("c", ep.id, T0 + 0.05, 8_000)  # after the scrape: in both
    assert usage_now(ep, T0 + 0.1, tracker) == pytest.approx(0.60)
    assert demand_now(ep, T0 + 0.1, tracker) == pytest.approx(1.25)
    tracker.complete("a", T0 + 0.2, 0)
    assert demand_now(ep, T0 + 0.3, tracker) == pytest.approx(14_000 / 16_000)


def test_without_a_kv_size_or_fresh_metrics_the_scrape_is_taken_as_it_is() -> None:
    tracker = KVTracker()
    bare = make_endpoint(0, kv=0.2, update_time=T0)
    tracker.dispatch("a", bare.id, T0 + 1, 5_000)
    assert usage_now(bare, T0 + 1.5, tracker) == pytest.approx(0.2)
    assert demand_now(bare, T0 + 1.5, tracker) == pytest.approx(0.2)
    stale = _ep(kv=0.3, scraped_at=T0)
    assert usage_now(stale, T0 + 2.5, tracker) == pytest.approx(0.3)
    assert usage_now(dataclasses.replace(bare, metrics=None), T0, tracker) == 1.0
