from __future__ import annotations

import dataclasses

import pytest

from epp.plugin import Endpoint, ProfileResult, ResponseInfo, SchedulingResult
from epp.plugin.inflight import LOAD_ESTIMATE, InFlightLoad
from epp.plugin.prefix import PrefixMatchInfo, TokenizedPrompt
from epp.plugins.producers.inflight import MAX_COMPLETIONS, InflightLoadProducer
from epp.plugins.producers.inflight_metrics import MAX_IDLE_SERIES
from scorers.active_request import ActiveRequestScorer
from scorers.token_load import TokenLoadScorer
from tests.builders import handle, make_cycle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(3)]


def producer(**kw) -> InflightLoadProducer:
    return InflightLoadProducer(
        name="inflight-load-producer", params=InflightLoadProducer.Params(**kw), handle=handle()
    )


def dispatch(
    p: InflightLoadProducer, rid: str, target: int, tokens: int = 0, cached_blocks: int = 0
) -> None:
    req = make_request(request_id=rid)
    req.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
        [list(range(tokens))]
    )
    req.attributes["PrefixCacheMatchInfo/approx-prefix-cache-producer"] = {
        EPS[target].id: PrefixMatchInfo(cached_blocks, 10, 64)
    }
    p.pre_request(req, SchedulingResult({"default": ProfileResult((EPS[target],))}, "default"))


async def loads(p: InflightLoadProducer) -> dict[str, InFlightLoad]:
    req = make_request()
    await p.produce(req, EPS)
    return req.attributes["InFlightLoad/inflight-load-producer"]


async def test_counts_dispatched_requests_and_uncached_tokens_until_completion() -> None:
    p = producer()
    dispatch(p, "a", 0, tokens=1000, cached_blocks=10)  # 640 cached → 360 uncached
    dispatch(p, "b", 0, tokens=100)
    dispatch(p, "c", 2, tokens=50)
    got = await loads(p)
    assert got[EPS[0].id] == InFlightLoad(2, 460)
    assert got[EPS[1].id] == InFlightLoad(0, 0)
    assert got[EPS[2].id] == InFlightLoad(1, 50)
    info = ResponseInfo(request_id="a", headers={})
    p.response_headers(make_request(request_id="a"), info, {})  # prefill over: tokens released
    assert (await loads(p))[EPS[0].id] == InFlightLoad(2, 100)
    p.response_complete(make_request(request_id="a"), info)
    p.response_complete(make_request(request_id="a"), info)  # twice is harmless
    p.response_complete(make_request(request_id="b"), info)
    assert (await loads(p))[EPS[0].id] == InFlightLoad(0, 0)


async def test_estimated_output_tokens_are_added_and_capped() -> None:
    p = producer(
        add_estimated_output_tokens=True, output_ratio=1.5, max_estimated_output_tokens=100
    )
    dispatch(p, "a", 1, tokens=200)
    assert (await loads(p))[EPS[1].id] == InFlightLoad(1, 300)


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        pytest.param([0, 0, 0], [1.0, 1.0, 1.0], id="all-idle"),
        pytest.param([4, 2, 0], [0.0, 0.5, 1.0], id="linear-in-max"),
        pytest.param([4, 4, 4], [0.0, 0.0, 0.0], id="all-equally-busy"),
    ],
)
def test_active_request_scorer_formula(counts: list[int], expected: list[float]) -> None:
    s = ActiveRequestScorer(name="a", params=ActiveRequestScorer.Params(), handle=handle())
    req = make_request()
    req.attributes["InFlightLoad/inflight-load-producer"] = {
        e.id: InFlightLoad(c, 0) for e, c in zip(EPS, counts, strict=True)
    }
    assert list(s.score(make_cycle(), req, EPS).values()) == expected


def test_active_request_scorer_idle_threshold_and_busy_cap() -> None:
    s = ActiveRequestScorer(
        name="a",
        params=ActiveRequestScorer.Params(idle_threshold=1, max_busy_score=0.5),
        handle=handle(),
    )
    req = make_request()
    req.attributes["InFlightLoad/inflight-load-producer"] = {
        EPS[0].id: InFlightLoad(1, 0),
        EPS[1].id: InFlightLoad(2, 0),
        EPS[2].id: InFlightLoad(4, 0),
    }
    assert list(s.score(make_cycle(), req, EPS).values()) == [1.0, 0.25, 0.0]


def test_token_load_scorer_formula() -> None:
    s = TokenLoadScorer(
        name="t", params=TokenLoadScorer.Params(queue_threshold_tokens=1000), handle=handle()
    )
    req = make_request()
    req.attributes["InFlightLoad/inflight-load-producer"] = {
        EPS[0].id: InFlightLoad(1, 250),
        EPS[1].id: InFlightLoad(1, 5000),
    }
    assert list(s.score(make_cycle(), req, EPS).values()) == [0.75, 0.0, 1.0]


# ---- LoadEstimate: the scrape, brought up to date with this EPP's own traffic ----------------

T0 = 1000.0


def at(p: InflightLoadProducer, now: float) -> None:
    p.handle.now = now  # type: ignore[attr-defined]


def complete(p: InflightLoadProducer, rid: str) -> None:
    p.response_complete(make_request(request_id=rid), ResponseInfo(request_id=rid, headers={}))


def scraped(queue: int = 0, running: int = 0, when: float = T0, i: int = 0) -> Endpoint:
    return make_endpoint(i, queue=queue, running=running, update_time=when)


async def estimate(p: InflightLoadProducer, ep: Endpoint) -> float:
    req = make_request()
    await p.produce(req, [ep])
    return LOAD_ESTIMATE.key(p.typed_name.name).get(req)[ep.id]


async def test_estimate_is_the_scrape_when_this_epp_sent_nothing() -> None:
    p = producer()
    at(p, T0 + 0.01)
    assert await estimate(p, scraped(queue=3, running=2)) == 5.0


async def test_dispatches_after_the_scrape_add_and_earlier_ones_are_in_it() -> None:
    p = producer()
    at(p, T0 - 0.02)
    dispatch(p, "before", 0)  # the scrape at T0 saw it: part of running=1
    at(p, T0 + 0.01)
    dispatch(p, "after-1", 0)
    dispatch(p, "after-2", 0)
    assert await estimate(p, scraped(queue=2, running=1)) == 3 + 2
    complete(p, "after-1")  # completed after the scrape but sent after it too: just gone
    assert await estimate(p, scraped(queue=2, running=1)) == 3 + 1


async def test_completions_of_requests_the_scrape_saw_subtract() -> None:
    p = producer()
    at(p, T0 - 0.03)
    dispatch(p, "a", 0)
    dispatch(p, "b", 0)
    at(p, T0 + 0.01)
    complete(p, "a")
    # scrape: 4 foreign + a + b; a finished since
    assert await estimate(p, scraped(queue=4, running=2)) == 5.0
    complete(p, "b")
    assert await estimate(p, scraped(queue=4, running=2)) == 4.0


async def test_a_newer_scrape_resets_the_corrections() -> None:
    p = producer()
    at(p, T0 - 0.03)
    dispatch(p, "old", 0)
    at(p, T0 + 0.01)
    complete(p, "old")
    dispatch(p, "new", 0)
    assert await estimate(p, scraped(queue=5, when=T0)) == 5 - 1 + 1
    at(p, T0 + 0.06)
    # the scrape at T0+0.05 saw "old" gone and "new" running: it counts neither again
    assert await estimate(p, scraped(queue=1, running=1, when=T0 + 0.05)) == 2.0
    assert p.dump_state()["completionRecords"] == {}  # pruned: that scrape saw the completion


async def test_estimate_never_goes_below_this_epps_own_requests_or_zero() -> None:
    p = producer()
    at(p, T0 - 0.001)
    dispatch(p, "in-transit-1", 0)  # sent just before the scrape, which missed them
    dispatch(p, "in-transit-2", 0)
    at(p, T0 + 0.01)
    assert await estimate(p, scraped(queue=0)) == 2.0
    dispatch(p, "c", 0)
    complete(p, "c")
    complete(p, "in-transit-1")
    assert await estimate(p, scraped(queue=0)) == 1.0  # never negative, floor = own


async def test_missing_or_stale_metrics_fall_back_to_the_in_flight_count() -> None:
    p = producer(metrics_staleness_threshold="500ms")
    at(p, T0)
    dispatch(p, "a", 0)
    dispatch(p, "b", 0)
    ep = dataclasses.replace(scraped(queue=9), metrics=None)
    assert await estimate(p, ep) == 2.0
    assert await estimate(p, scraped(queue=9, when=0.0)) == 2.0  # never scraped
    at(p, T0 + 0.4)
    assert await estimate(p, scraped(queue=9, when=T0 - 0.01)) == 9 + 2  # fresh enough
    at(p, T0 + 0.6)
    assert await estimate(p, scraped(queue=9, when=T0 - 0.01)) == 2.0  # stale
    assert await estimate(p, make_endpoint(1, queue=9, update_time=T0 - 0.01)) == 0.0


async def test_estimate_is_computed_when_first_read_then_fixed() -> None:
    p = producer()
    at(p, T0 + 0.01)
    ep = scraped(queue=1)
    req = make_request()
    await p.produce(req, [ep])
    dispatch(p, "x", 0)  # scheduled for another request between produce and scoring
    estimates = req.attributes["LoadEstimate/inflight-load-producer"]
    assert dict(estimates) == {ep.id: 2.0}
    dispatch(p, "y", 0)
    assert estimates[ep.id] == 2.0 and estimates.get(ep.id) == 2.0
    assert estimates.get("nope", -1.0) == -1.0 and "nope" not in estimates
    assert len(estimates) == 1 and list(estimates.items()) == [(ep.id, 2.0)]


async def test_completion_records_stay_bounded() -> None:
    p = producer(metrics_staleness_threshold="1s")
    at(p, T0 - 10)
    for i in range(MAX_COMPLETIONS + 100):
        dispatch(p, f"r{i}", 0)
    at(p, T0)
    for i in range(MAX_COMPLETIONS + 100):  # no scrape ever comes: capped per endpoint
        complete(p, f"r{i}")
    assert p.dump_state()["completionRecords"] == {EPS[0].id: MAX_COMPLETIONS}
    at(p, T0 + 0.5)
    assert await estimate(p, scraped(queue=0, when=T0 + 0.1)) == 0.0
    assert p.dump_state()["completionRecords"] == {}  # a newer scrape saw them all
    dispatch(p, "z", 1)
    complete(p, "z")  # an endpoint that is never scored again ...
    at(p, T0 + 2.0)
    dispatch(p, "w", 2)
    complete(p, "w")  # ... is swept once its records are older than the staleness bound
    assert p.dump_state()["completionRecords"] == {EPS[2].id: 1}
    assert p.dump_state()["requests"] == {} and p.dump_state()["open"] == 0


def test_staleness_threshold_must_be_a_positive_duration() -> None:
    assert producer(metrics_staleness_threshold="250ms").params.staleness_seconds == 0.25
    assert producer().params.staleness_seconds == 2.0
    with pytest.raises(ValueError, match="metricsStalenessThreshold"):
        producer(metrics_staleness_threshold="0s")
    with pytest.raises(ValueError, match="invalid duration 'soon'"):
        producer(metrics_staleness_threshold="soon")


def test_produces_both_keys() -> None:
    assert producer().produces() == {
        "InFlightLoad/inflight-load-producer",
        "LoadEstimate/inflight-load-producer",
    }


def test_it_reads_no_response_body() -> None:
    # headers (prefill done) and completion are all it uses: a streamed body may be skipped
    info = ResponseInfo(request_id="r", headers={})
    assert producer().needs_response_body(make_request(), info) is False


async def test_an_estimate_is_computed_again_only_when_what_it_depends_on_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = producer(metrics_staleness_threshold="500ms")
    at(p, T0 - 0.03)
    dispatch(p, "a", 0)
    at(p, T0 + 0.01)
    eps = [scraped(queue=3, i=0), scraped(queue=1, i=1)]
    computed: list[str] = []
    real = p._estimate_fresh

    def counting(ep: Endpoint, now: float) -> tuple[float, float]:
        computed.append(ep.id)
        return real(ep, now)

    monkeypatch.setattr(p, "_estimate_fresh", counting)

    async def read() -> list[float]:
        req = make_request()
        await p.produce(req, eps)
        values = LOAD_ESTIMATE.key(p.typed_name.name).get(req)
        return [values[ep.id] for ep in eps]

    assert await read() == [3.0, 1.0] and len(computed) == 2
    assert await read() == [3.0, 1.0] and len(computed) == 2  # nothing changed: reused
    dispatch(p, "b", 0)
    assert await read() == [4.0, 1.0] and computed[2:] == [EPS[0].id]  # only pod 0 again
    complete(p, "a")  # the scrape saw "a": its completion subtracts
    assert await read() == [3.0, 1.0] and computed[3:] == [EPS[0].id]
    eps[1] = scraped(queue=5, i=1)  # a new scrape of pod 1
    assert await read() == [3.0, 5.0] and computed[4:] == [EPS[1].id]
    at(p, T0 + 0.6)  # both scrapes are stale now: the in-flight counts alone
    assert await read() == [1.0, 0.0] and len(computed) == 7


async def test_the_estimate_kept_up_to_date_equals_one_computed_from_the_whole_history() -> None:
    import random

    rng = random.Random(3)
    p = producer(metrics_staleness_threshold="100s")
    sent: dict[str, float] = {}
    ended: dict[str, tuple[float, float]] = {}
    now, scrape, n = T0, T0, 0
    for _ in range(1_500):
        now += rng.uniform(0.0, 0.01)
        at(p, now)
        roll = rng.random()
        if roll < 0.45:
            rid = f"r{n}"
            n += 1
            dispatch(p, rid, 0)
            sent[rid] = now
        elif roll < 0.85 and sent:
            rid = rng.choice(sorted(sent))
            complete(p, rid)
            ended[rid] = (now, sent.pop(rid))
        elif roll < 0.9:
            scrape = max(scrape, now - rng.uniform(0.0, 0.05))
        after = sum(1 for t in sent.values() if t > scrape)
        seen_end = sum(1 for end, t in ended.values() if end > scrape and t <= scrape)
        expected = max(len(sent), max(0, 7 - seen_end) + after)
        assert await estimate(p, scraped(queue=4, running=3, when=scrape)) == expected


def _gauge(p: InflightLoadProducer, family: str) -> dict[tuple[str, ...], float]:
    """The samples of ``family`` on the producer's registry, keyed by their label values."""
    names = ("endpoint_name", "namespace", "producer_name", "fairness_id", "priority")
    out: dict[tuple[str, ...], float] = {}
    for metric in p.handle.registry.collect():
        for s in metric.samples:
            if s.name == family:
                out[tuple(s.labels[k] for k in names)] = s.value
    return out


def test_inflight_gauges_follow_requests_and_tokens_per_fairness_and_priority() -> None:
    p = producer()
    for rid, fairness, priority, tokens in (("a", "team-a", 0, 300), ("b", "team-a", 0, 100)):
        req = make_request(request_id=rid, fairness_id=fairness, priority=priority)
        req.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
            [list(range(tokens))]
        )
        p.pre_request(req, SchedulingResult({"default": ProfileResult((EPS[1],))}, "default"))
    low = make_request(request_id="c", fairness_id="team-b", priority=-1)
    p.pre_request(low, SchedulingResult({"default": ProfileResult((EPS[1],))}, "default"))
    a = ("pod-1-rank-0", "default", "inflight-load-producer", "team-a", "0")
    b = ("pod-1-rank-0", "default", "inflight-load-producer", "team-b", "-1")
    assert _gauge(p, "llm_d_epp_inflight_requests") == {a: 2.0, b: 1.0}
    assert _gauge(p, "llm_d_epp_inflight_tokens") == {a: 400.0, b: 0.0}
    info = ResponseInfo(request_id="a", headers={})
    p.response_headers(make_request(request_id="a"), info, {})  # prefill over: tokens go
    assert _gauge(p, "llm_d_epp_inflight_tokens") == {a: 100.0, b: 0.0}
    for rid in ("a", "c"):
        p.response_complete(make_request(request_id=rid), info)
    assert _gauge(p, "llm_d_epp_inflight_requests") == {a: 1.0, b: 0.0}  # team-b's is idle
    p.response_complete(make_request(request_id="b"), info)
    assert _gauge(p, "llm_d_epp_inflight_requests") == {a: 0.0, b: 0.0}
    assert _gauge(p, "llm_d_epp_inflight_tokens") == {a: 0.0, b: 0.0}


def test_idle_inflight_series_are_kept_up_to_a_bound_then_the_oldest_go() -> None:
    """Fairness ids are the client's: however many it sends, at most ``MAX_IDLE_SERIES`` series
    at zero stay (a series in use never goes), and one back in use leaves the idle ones."""
    p = producer()
    result = SchedulingResult({"default": ProfileResult((EPS[1],))}, "default")
    busy = make_request(request_id="busy", fairness_id="busy")
    p.pre_request(busy, result)
    extra = 5
    for i in range(MAX_IDLE_SERIES + extra):
        req = make_request(request_id=f"r{i}", fairness_id=f"tenant-{i}")
        p.pre_request(req, result)
        p.response_complete(req, ResponseInfo(request_id=f"r{i}", headers={}))
        if i == MAX_IDLE_SERIES // 2:  # the first idle series is used again: newest idle now
            first = make_request(request_id="again", fairness_id="tenant-0")
            p.pre_request(first, result)
            p.response_complete(first, ResponseInfo(request_id="again", headers={}))
    series = _gauge(p, "llm_d_epp_inflight_requests")
    tenants = {labels[3] for labels in series}
    assert len(series) == MAX_IDLE_SERIES + 1  # the idle ones and the busy one
    assert "busy" in tenants and "tenant-0" in tenants
    assert {f"tenant-{i}" for i in range(1, extra + 1)}.isdisjoint(tenants)  # the oldest went
    assert f"tenant-{extra + 1}" in tenants
    assert series[("pod-1-rank-0", "default", "inflight-load-producer", "busy", "0")] == 1.0
