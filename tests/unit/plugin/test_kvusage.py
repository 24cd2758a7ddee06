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


def test_change_walks_the_records_once_per_scrape_and_follows_every_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tracker = KVTracker()
    tracker.dispatch("a", "ep", T0 - 1.0, 1000)
    tracker.dispatch("b", "ep", T0 + 0.1, 400)
    tracker.complete("a", T0 + 0.2, 1100)
    walked: list[float] = []
    real = kvusage._drop_until

    def counting(done: deque[tuple[float, float, int]], until: float) -> bool:
        walked.append(until)
        return real(done, until)

    monkeypatch.setattr(kvusage, "_drop_until", counting)
    assert tracker.change("ep", T0) == 400 - 1100
    assert tracker.change("ep", T0) == -700 and walked == [T0]  # kept, not walked again
    tracker.dispatch("c", "ep", T0 + 0.3, 50)
    assert tracker.change("ep", T0) == -650 and walked == [T0]  # updated, not walked
    tracker.complete("b", T0 + 0.4, 0)  # sent after the scrape: no longer added, not released
    assert tracker.change("ep", T0) == -1050 and walked[-1] != T0 + 0.25
    # a newer scrape saw "a" end and "b" run: "b" has ended since, "c" was sent since
    assert tracker.change("ep", T0 + 0.25) == 50 - 400 and walked[-1] == T0 + 0.25
    assert tracker.in_flight("ep") == 50


def _reference(events: list[tuple[str, str, float, int]], scraped_at: float) -> int:
    """``change`` computed from the whole history: added = in flight and sent after the scrape,
    released = completed after the scrape and sent at or before it."""
    sent: dict[str, tuple[float, int]] = {}
    done: dict[str, tuple[float, float, int]] = {}
    for kind, rid, at, tokens in events:
        if kind == "dispatch":
            sent[rid] = (at, tokens)
        elif rid in sent:
            s_at, s_tokens = sent.pop(rid)
            done[rid] = (at, s_at, tokens or s_tokens)
    added = sum(t for at, t in sent.values() if at > scraped_at)
    released = sum(t for end, at, t in done.values() if end > scraped_at and at <= scraped_at)
    return added - released


def test_change_always_equals_the_change_computed_from_the_whole_history() -> None:
    import random

    rng = random.Random(5)
    tracker = KVTracker(horizon=100.0)
    events: list[tuple[str, str, float, int]] = []
    now, scrape, open_ids, n = T0, T0, [], 0
    for _ in range(2_000):
        now += rng.uniform(0.0, 0.01)
        roll = rng.random()
        if roll < 0.45:
            rid, tokens = f"r{n}", rng.randrange(1, 5_000)
            n += 1
            tracker.dispatch(rid, "ep", now, tokens)
            events.append(("dispatch", rid, now, tokens))
            open_ids.append(rid)
        elif roll < 0.85 and open_ids:
            rid = open_ids.pop(rng.randrange(len(open_ids)))
            held = rng.choice((0, rng.randrange(1, 6_000)))
            tracker.complete(rid, now, held)
            events.append(("complete", rid, now, held))
        elif roll < 0.9:
            scrape = max(scrape, now - rng.uniform(0.0, 0.05))  # a newer scrape
        assert tracker.change("ep", scrape) == _reference(events, scrape)


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


def test_usages_and_rooms_memos_follow_every_change_and_each_staleness() -> None:
    """The memoised values equal ``usage_now``/``demand_now`` whatever happened in between: a
    dispatch, a completion, a new scrape, the time passing the scrape's staleness, and a caller
    asking with another staleness."""
    import random

    rng = random.Random(5)
    tracker = KVTracker()
    eps = [dataclasses.replace(_ep(kv=0.1 * i), id=f"p{i}") for i in range(4)]
    now, open_ids, n = T0, [], 0
    for _ in range(600):
        now += rng.uniform(0.0, 0.05)
        roll = rng.random()
        i = rng.randrange(4)
        if roll < 0.35:
            n += 1
            open_ids.append(f"r{n}")
            tracker.dispatch(f"r{n}", eps[i].id, now, rng.randrange(1, 3_000))
        elif roll < 0.6 and open_ids:
            tracker.complete(open_ids.pop(rng.randrange(len(open_ids))), now, 0)
        elif roll < 0.7:
            eps[i] = dataclasses.replace(eps[i], metrics=dataclasses.replace(
                eps[i].metrics, update_time=now, kv_cache_usage_percent=rng.random()))  # fmt: skip
        staleness = rng.choice((2.0, 0.5))
        got = tracker.usages(eps, now, staleness)
        assert got == pytest.approx([usage_now(e, now, tracker, staleness) for e in eps])
        rooms = tracker.rooms(eps, now, 0.9)
        want = [0.9 * capacity_tokens(e) - demand_now(e, now, tracker) * capacity_tokens(e)
                for e in eps]  # fmt: skip
        assert rooms == pytest.approx(want)
