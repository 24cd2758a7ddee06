"""``kv-headroom-filter``: routing never sends a pod more than its KV cache can hold."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from epp.plugin import (
    Endpoint,
    PluginConfigError,
    ProfileResult,
    RequestBody,
    ResponseInfo,
    SchedulingResult,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.prefix import TokenizedPrompt
from epp.plugin.testing import check_filter, check_plugin_class, sample_endpoints
from filters.kv_headroom import KVHeadroomFilter
from tests.builders import NOW, FakeHandle, make_cycle, make_endpoint, make_request

BLOCK = 16


def _ep(i: int, kv: float, blocks: int | None = 1000, scraped_at: float = NOW) -> Endpoint:
    ep = make_endpoint(i, kv=kv, update_time=scraped_at)
    assert ep.metrics is not None
    if blocks is None:
        return ep
    metrics = dataclasses.replace(ep.metrics, cache_num_blocks=blocks, cache_block_size=BLOCK)
    return dataclasses.replace(ep, metrics=metrics)


def _filter(**params: Any) -> KVHeadroomFilter:
    return KVHeadroomFilter(
        name="kv", params=decode(KVHeadroomFilter.Params, params), handle=FakeHandle()
    )


def _request(rid: str, prompt: int, max_tokens: int | None = None) -> Any:
    body = RequestBody("chat", {}, b"{}", max_output_tokens=max_tokens)
    req = make_request(request_id=rid, body=body)
    req.attributes["TokenizedPrompt/token-producer"] = TokenizedPrompt.from_token_ids(
        [list(range(prompt))]
    )
    return req


def _ids(eps: Any) -> list[str]:
    return [e.id for e in eps]


def test_a_pod_whose_kv_cannot_take_the_request_is_left_out() -> None:
    f = _filter()
    eps = [_ep(0, kv=0.90), _ep(1, kv=0.40)]  # 16,000 tokens each; pod 0 has 800 left at 0.95
    req = _request("r", prompt=600, max_tokens=100)
    assert _ids(f.filter(make_cycle(), req, eps)) == _ids(eps)
    big = _request("r2", prompt=1_000, max_tokens=100)
    assert _ids(f.filter(make_cycle(), big, eps)) == [eps[1].id]


def test_requests_this_epp_sent_count_before_the_server_shows_them() -> None:
    f = _filter(maxUsage=1.0, defaultOutputTokens=500)
    eps = [_ep(0, kv=0.0), _ep(1, kv=0.0)]
    for n in range(3):  # three requests of 4,500 tokens to pod 0, still queued there
        sent = _request(f"s{n}", prompt=4_000)
        f.pre_request(sent, SchedulingResult({"default": ProfileResult((eps[0],))}, "default"))
    # the scrape (taken before) shows pod 0 empty: 13,500 of its 16,000 tokens are promised
    nxt = _request("next", prompt=3_000)
    assert _ids(f.filter(make_cycle(now=NOW + 0.1), nxt, eps)) == [eps[1].id]
    info = ResponseInfo(request_id="s0", headers={})
    f.response_complete(_request("s0", prompt=4_000), info)
    assert _ids(f.filter(make_cycle(now=NOW + 0.2), nxt, eps)) == _ids(eps)


def test_when_no_pod_fits_the_one_with_most_room_is_kept() -> None:
    f = _filter()
    eps = [_ep(0, kv=0.90), _ep(1, kv=0.85), _ep(2, kv=0.93)]
    huge = _request("h", prompt=5_000)
    assert _ids(f.filter(make_cycle(), huge, eps)) == [eps[1].id]


def test_a_pod_without_a_kv_size_is_not_judged() -> None:
    f = _filter()
    eps = [
        _ep(0, kv=0.99, blocks=None),
        _ep(1, kv=0.99),
        dataclasses.replace(_ep(2, 0.0), metrics=None),
    ]
    kept = f.filter(make_cycle(), _request("r", prompt=2_000), eps)
    assert _ids(kept) == [eps[0].id, eps[2].id]


def test_parameters_are_checked_and_the_plugin_fills_its_role() -> None:
    with pytest.raises((PluginConfigError, ParamError)):
        _filter(maxUsage=0.0)
    with pytest.raises((PluginConfigError, ParamError)):
        _filter(defaultOutputTokens=-1)
    check_plugin_class(KVHeadroomFilter, "kv-headroom-filter")
    check_filter(_filter(), sample_endpoints(4), _request("k", prompt=100))
