from __future__ import annotations

import pytest

from epp.plugin import ProfileResult, ResponseInfo, SchedulingResult
from epp.plugin.inflight import InFlightLoad
from epp.plugin.prefix import PrefixMatchInfo, TokenizedPrompt
from epp.plugins.producers.inflight import InflightLoadProducer
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
