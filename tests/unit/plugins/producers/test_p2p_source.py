"""``p2p-source-producer``: the peer that caches most of the prompt, named to the computing pod
in ``x-kv-cache-source-host-port``."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from epp.plugin import PrefixMatchInfo, ProfileResult, SchedulingResult
from epp.plugin.params import ParamError, decode
from epp.plugins.producers.p2p_source import HEADER, P2PSourceProducer, Source, spread_fraction
from tests.builders import FakeHandle, make_endpoint, make_request

EPS = [make_endpoint(i) for i in range(4)]
KEY = "PrefixCacheMatchInfo/approx-prefix-cache-producer"


def producer(**params: Any) -> P2PSourceProducer:
    return P2PSourceProducer(
        name="p2p", params=decode(P2PSourceProducer.Params, params), handle=FakeHandle()
    )


def request(blocks: dict[int, int], rid: str = "req-0") -> Any:
    req = make_request(request_id=rid)
    req.attributes[KEY] = {EPS[i].id: PrefixMatchInfo(n, 10, 64) for i, n in blocks.items()}
    return req


def routed(req: Any, decode_to: int, prefill_to: int | None = None) -> SchedulingResult:
    results = {"decode": ProfileResult((EPS[decode_to],))}
    if prefill_to is not None:
        results["prefill"] = ProfileResult((EPS[prefill_to],))
    return SchedulingResult(results, "decode")


async def test_the_computing_pod_is_told_the_peer_caching_more_of_the_prompt() -> None:
    p = producer()
    req = request({0: 6, 1: 2})
    await p.produce(req, EPS)
    p.pre_request(req, routed(req, decode_to=1))
    assert req.upstream_headers == {HEADER: EPS[0].hostport}


async def test_no_header_when_the_computing_pod_is_the_source_or_not_enough_better() -> None:
    p = producer(minCachedTokenDelta=200)
    req = request({0: 6, 1: 4})  # 384 tokens against 256: 128 more, under the delta
    await p.produce(req, EPS)
    p.pre_request(req, routed(req, decode_to=1))
    assert HEADER not in req.upstream_headers
    p.pre_request(req, routed(req, decode_to=0))  # the source computes itself
    assert HEADER not in req.upstream_headers
    nothing = request({})
    await p.produce(nothing, EPS)
    nothing.upstream_headers[HEADER] = "10.0.0.1:1"  # a stale value goes
    p.pre_request(nothing, routed(nothing, decode_to=1))
    assert nothing.upstream_headers == {}


async def test_the_prefill_pick_computes_when_the_prefill_profile_ran() -> None:
    p = producer()
    req = request({0: 6, 2: 6})
    await p.produce(req, EPS[:1] + EPS[1:2])  # only pod 0 is a candidate source
    p.pre_request(req, routed(req, decode_to=0, prefill_to=3))
    assert req.upstream_headers == {HEADER: EPS[0].hostport}  # prefill on 3 pulls from 0


async def test_near_best_peers_share_requests_weighted_by_their_idleness() -> None:
    p = producer()
    busy = dataclasses.replace(
        EPS[1], metrics=dataclasses.replace(EPS[1].metrics, waiting_queue_size=9)
    )
    pool = [EPS[0], busy, EPS[2]]
    picked: dict[str, int] = {}
    for i in range(400):
        req = request({0: 6, 1: 6, 2: 1}, rid=str(uuid.uuid5(uuid.NAMESPACE_URL, str(i))))
        await p.produce(req, pool)
        source = req.attributes["best-match/p2p"]
        assert isinstance(source, Source) and source.cached_tokens == 384
        picked[source.hostport] = picked.get(source.hostport, 0) + 1
    assert set(picked) == {EPS[0].hostport, EPS[1].hostport}  # pod 2 is not near the best
    # weights 1 and 1/10: the idle pod gets about 10 of every 11 requests
    assert 330 < picked[EPS[0].hostport] < 390


def test_the_draw_is_upstreams_fnv1a_of_the_request_id() -> None:
    assert spread_fraction("") == 0x811C9DC5 / 2**32
    assert spread_fraction("a") == 0xE40C292C / 2**32  # FNV-1a 32 of "a"
    assert spread_fraction("req-1") == spread_fraction("req-1")


def test_min_cached_token_delta_below_one_is_refused() -> None:
    with pytest.raises(ParamError, match="minCachedTokenDelta must be >= 1"):
        decode(P2PSourceProducer.Params, {"minCachedTokenDelta": 0})


def test_it_consumes_the_named_prefix_producer() -> None:
    keys = {str(k) for k in producer(prefixMatchInfoProducerName="precise").consumes()}
    assert keys == {"PrefixCacheMatchInfo/precise"}
    assert {str(k) for k in producer().consumes()} == {KEY}
