from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epp.plugin import (
    Consumer,
    DataProducer,
    Endpoint,
    PrefixMatchInfo,
    PreRequest,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from epp.plugins.producers.prefix_index import ChainCache
from epp.plugins.producers.tokens import TokenProducer
from tests.builders import NOW, FakeHandle, make_endpoint, make_request

KEY = "PrefixCacheMatchInfo/approx-prefix-cache-producer"
TOKENS_KEY = "TokenizedPrompt/token-producer"


def _producer(
    h: FakeHandle | None = None, name: str = "", **params: Any
) -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(
        name=name,
        params=decode(ApproxPrefixCacheProducer.Params, params),
        handle=h or FakeHandle(),
    )


def _endpoint(i: int, *, block_size: int = 0, num_blocks: int = 0) -> Endpoint:
    ep = make_endpoint(i)
    assert ep.metrics is not None
    metrics = dataclasses.replace(
        ep.metrics, cache_block_size=block_size, cache_num_blocks=num_blocks
    )
    return dataclasses.replace(ep, metrics=metrics)


def _request(
    n_tokens: int, *, model: str = "m", salt: str = "", first: int = 0, request_id: str = "r"
) -> Any:
    ids = [first, *range(1, n_tokens)] if n_tokens else []
    prompt = TokenizedPrompt.from_token_ids([ids], cache_salt=salt)
    return make_request(request_id=request_id, target_model=model, attributes={TOKENS_KEY: prompt})


def _result(target: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    results = {"decode": ProfileResult(targets=(target,))}
    if prefill is not None:
        results["prefill"] = ProfileResult(targets=(prefill,))
    return SchedulingResult(profile_results=results, primary_profile="decode")


async def _schedule(
    p: ApproxPrefixCacheProducer, request: Any, pool: list[Endpoint], target: Endpoint
) -> dict[str, PrefixMatchInfo]:
    await p.produce(request, pool)
    p.pre_request(request, _result(target))
    (key,) = p.produces()
    return dict(request.attributes[key])


async def test_identical_request_matches_all_blocks_on_learned_endpoint_only() -> None:
    p = _producer()
    pool = [make_endpoint(i) for i in range(3)]
    first = await _schedule(p, _request(640), pool, pool[1])
    assert first == dict.fromkeys((ep.id for ep in pool), PrefixMatchInfo(0, 10, 64))
    second = _request(640)
    await p.produce(second, pool)
    assert second.attributes[KEY] == {
        pool[0].id: PrefixMatchInfo(0, 10, 64),
        pool[1].id: PrefixMatchInfo(10, 10, 64),
        pool[2].id: PrefixMatchInfo(0, 10, 64),
    }


@pytest.mark.parametrize(
    ("second", "expected_match"),
    [
        pytest.param({}, 10, id="identical"),
        pytest.param({"n_tokens": 1000}, 10, id="longer-prompt-shares-prefix"),
        pytest.param({"n_tokens": 300}, 4, id="shorter-prompt"),
        pytest.param({"first": 12345}, 0, id="first-block-differs"),
        pytest.param({"salt": "tenant-b"}, 0, id="salt-separates"),
        pytest.param({"model": "other"}, 0, id="model-separates"),
    ],
)
async def test_match_follows_shared_prefix_when_second_request_differs(
    second: dict[str, Any], expected_match: int
) -> None:
    p = _producer()
    pool = [make_endpoint(0)]
    await _schedule(p, _request(640), pool, pool[0])
    request = _request(**{"n_tokens": 640, **second})
    await p.produce(request, pool)
    assert request.attributes[KEY][pool[0].id].match_blocks == expected_match


@pytest.mark.parametrize(
    ("params", "metrics_block_size", "expected"),
    [
        pytest.param({}, 0, 64, id="default-16-clamped"),
        pytest.param({}, 16, 64, id="engine-16-clamped"),
        pytest.param({}, 128, 128, id="autotuned-from-engine"),
        pytest.param({"blockSizeTokens": 256}, 0, 256, id="configured"),
        pytest.param({"blockSizeTokens": 256, "autoTune": False}, 128, 256, id="autotune-off"),
        pytest.param({"blockSize": 96}, 0, 96, id="deprecated-alias"),
        pytest.param({"blockSize": 96, "blockSizeTokens": 80}, 0, 80, id="alias-loses"),
    ],
)
def test_block_size_resolves_when_configured_or_autotuned(
    params: dict[str, Any], metrics_block_size: int, expected: int
) -> None:
    p = _producer(**params)
    assert p.block_size([_endpoint(0, block_size=metrics_block_size), make_endpoint(1)]) == expected


def test_block_size_uses_first_candidate_when_autotuning() -> None:
    p = _producer()
    endpoints = [make_endpoint(0), _endpoint(1, block_size=512)]
    assert p.block_size(endpoints) == 64
    assert p.block_size(endpoints[::-1]) == 512


@pytest.mark.parametrize(
    ("params", "n_tokens", "expected_total"),
    [
        pytest.param({}, 64 * 3000, 2048, id="default-token-cap"),
        pytest.param({"maxPrefixTokensToMatch": 640}, 64 * 20, 10, id="token-cap"),
        pytest.param(
            {"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 5}, 64 * 20, 5, id="block-cap"
        ),
        pytest.param(
            {"maxPrefixTokensToMatch": 0, "maxPrefixBlocksToMatch": 0},
            64 * 3000,
            3000,
            id="unlimited",
        ),
        pytest.param({"maxPrefixTokensToMatch": 10}, 640, 0, id="token-cap-below-block"),
        pytest.param({}, 65, 2, id="partial-last-block"),
        pytest.param({}, 0, 0, id="empty-prompt"),
    ],
)
async def test_total_blocks_capped_when_limits_set(
    params: dict[str, Any], n_tokens: int, expected_total: int
) -> None:
    p = _producer(**params)
    request = _request(n_tokens)
    await p.produce(request, [make_endpoint(0)])
    assert request.attributes[KEY][make_endpoint(0).id].total_blocks == expected_total


async def test_match_info_is_zero_when_no_tokenized_prompt() -> None:
    p = _producer()
    pool = [make_endpoint(0), make_endpoint(1)]
    request = make_request(target_model="m")
    await p.produce(request, pool)
    p.pre_request(request, _result(pool[0]))
    assert request.attributes[KEY] == dict.fromkeys(
        (ep.id for ep in pool), PrefixMatchInfo(0, 0, 64)
    )
    assert p.index.size == 0


async def test_match_sums_over_prompts_when_several_prompts() -> None:
    p = _producer()
    pool = [make_endpoint(0)]
    prompt = TokenizedPrompt.from_token_ids([range(128), range(1000, 1064), []])
    first = make_request(target_model="m", attributes={TOKENS_KEY: prompt})
    await _schedule(p, first, pool, pool[0])
    second = make_request(target_model="m", attributes={TOKENS_KEY: prompt})
    await p.produce(second, pool)
    assert second.attributes[KEY][pool[0].id] == PrefixMatchInfo(3, 3, 64)


async def test_pre_request_uses_stored_hashes_when_prompt_attribute_gone() -> None:
    p = _producer()
    pool = [make_endpoint(0)]
    request = _request(640)
    await p.produce(request, pool)
    del request.attributes[TOKENS_KEY]
    p.pre_request(request, _result(pool[0]))
    assert p.index.block_counts() == {pool[0].id: 10}


async def test_pre_request_learns_prefill_target_when_prefill_profile_present() -> None:
    p = _producer()
    pool = [make_endpoint(i) for i in range(3)]
    request = _request(640)
    await p.produce(request, pool)
    p.pre_request(request, _result(pool[0], prefill=pool[2]))
    assert p.index.block_counts() == {pool[0].id: 10, pool[2].id: 10}


async def test_pre_request_learns_nothing_when_no_target() -> None:
    p = _producer()
    request = _request(640)
    await p.produce(request, [make_endpoint(0)])
    empty = SchedulingResult(profile_results={"d": ProfileResult(targets=())}, primary_profile="d")
    p.pre_request(request, empty)
    assert p.index.size == 0


@pytest.mark.parametrize(
    ("params", "num_blocks", "expected_capacity"),
    [
        pytest.param({}, 0, 31250, id="default"),
        pytest.param({}, 4, 4, id="autotuned-from-engine"),
        pytest.param({"lruCapacityPerServer": 6}, 0, 6, id="configured"),
        pytest.param({"lruCapacityPerServer": 6, "autoTune": False}, 4, 6, id="autotune-off"),
        pytest.param({"lruCapacityPerServer": 0}, 0, 31250, id="zero-means-default"),
    ],
)
async def test_lru_capacity_resolves_when_endpoint_learns(
    params: dict[str, Any], num_blocks: int, expected_capacity: int
) -> None:
    p = _producer(**params)
    ep = _endpoint(0, num_blocks=num_blocks)
    await _schedule(p, _request(640), [ep], ep)
    assert p.index.capacity(ep.id) == expected_capacity
    assert p.index.size == min(10, expected_capacity)


async def test_lru_capacity_counts_index_blocks_when_engine_blocks_are_smaller() -> None:
    """A pod with 40 engine blocks of 16 tokens caches 640 tokens: 10 index blocks of 64, not 40
    (upstream's count, which believes the pod holds four times what it does)."""
    p = _producer()
    ep = _endpoint(0, block_size=16, num_blocks=40)
    await _schedule(p, _request(640 * 3), [ep], ep)
    assert p.index.capacity(ep.id) == 10
    assert p.index.size == 10


async def test_lru_evicts_older_prompt_when_endpoint_capacity_reached() -> None:
    p = _producer(lruCapacityPerServer=10)
    pool = [make_endpoint(0)]
    await _schedule(p, _request(640, first=1), pool, pool[0])
    await _schedule(p, _request(640, first=2), pool, pool[0])
    again = _request(640, first=1)
    await p.produce(again, pool)
    assert again.attributes[KEY][pool[0].id].match_blocks == 0
    assert p.index.size == 10


async def test_purge_drops_departed_endpoints_when_interval_elapsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = FakeHandle()
    p = _producer(h)
    pool = [make_endpoint(0), make_endpoint(1)]
    live = list(pool)
    monkeypatch.setattr(h, "endpoints", lambda: live)
    for target in pool:
        await _schedule(p, _request(640, request_id=target.id), pool, target)
    live.remove(pool[0])
    h.now = NOW + 1.0  # within the interval: nothing purged yet
    await _schedule(p, _request(64, first=9), pool, pool[1])
    assert set(p.index.endpoints()) == {pool[0].id, pool[1].id}
    h.now = NOW + 2.5
    await _schedule(p, _request(64, first=9), pool, pool[1])
    assert p.index.endpoints() == [pool[1].id]


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_metrics_recorded_when_request_scheduled() -> None:
    h = FakeHandle()
    p = _producer(h)
    pool = [make_endpoint(0)]
    await _schedule(p, _request(640), pool, pool[0])
    await _schedule(p, _request(1280), pool, pool[0])
    labels = {"plugin_name": "approx-prefix-cache-producer", "plugin_type": p.TYPE}
    r = h.registry
    # 20 blocks: the dense head of 16, then whole groups of 8 only
    assert _sample(r, "llm_d_epp_prefix_indexer_size", **labels) == 16
    assert _sample(r, "inference_extension_prefix_indexer_size") == 16
    assert _sample(r, "llm_d_epp_prefix_indexer_hit_ratio_count", **labels) == 2
    assert _sample(r, "llm_d_epp_prefix_indexer_hit_ratio_sum", **labels) == 0.5
    # bytes = blocks * 64 tokens * 4: the second request matched 10 blocks
    assert _sample(r, "llm_d_epp_prefix_indexer_hit_bytes_sum", **labels) == 10 * 64 * 4
    assert _sample(r, "inference_extension_prefix_indexer_hit_bytes_count") == 2


async def test_metrics_shared_when_two_instances_use_one_registry() -> None:
    h = FakeHandle()
    a = _producer(h, name="a")
    b = _producer(h, name="b")
    pool = [make_endpoint(0)]
    await _schedule(a, _request(640), pool, pool[0])
    await _schedule(b, _request(128), pool, pool[0])
    size = "llm_d_epp_prefix_indexer_size"
    assert _sample(h.registry, size, plugin_name="a", plugin_type=a.TYPE) == 10
    assert _sample(h.registry, size, plugin_name="b", plugin_type=b.TYPE) == 2


@pytest.mark.parametrize(
    ("name", "produces"),
    [
        pytest.param("", KEY, id="default-name"),
        pytest.param("approx2", "PrefixCacheMatchInfo/approx2", id="custom-name"),
    ],
)
def test_keys_declared_when_constructed(name: str, produces: str) -> None:
    p = _producer(name=name)
    assert isinstance(p, DataProducer)
    assert isinstance(p, PreRequest)
    assert isinstance(p, Consumer)
    assert p.produces() == frozenset({produces})
    assert p.consumes() == frozenset({TOKENS_KEY})


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param(
            {"blockSizeTokens": -1},
            "blockSizeTokens must be >= 0, got \\-1",
            id="negative-block-size",
        ),
        pytest.param(
            {"blockSizeTokens": 0, "autoTune": False},
            "blockSizeTokens must be > 0 when autoTune is false",
            id="zero-block-size-no-autotune",
        ),
        pytest.param(
            {"maxPrefixTokensToMatch": -1},
            "maxPrefixTokensToMatch must be >= 0, got \\-1",
            id="negative-token-cap",
        ),
        pytest.param(
            {"maxPrefixBlocksToMatch": -1},
            "maxPrefixBlocksToMatch must be >= 0, got \\-1",
            id="negative-block-cap",
        ),
        pytest.param(
            {"lruCapacityPerServer": -5},
            "lruCapacityPerServer must be >= 0, got \\-5",
            id="negative-capacity",
        ),
        pytest.param(
            {"unknown": 1}, "unknown: unknown field \\(known: autoTune,", id="unknown-field"
        ),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(ApproxPrefixCacheProducer.Params, params)


async def test_dump_state_reports_block_counts_when_index_populated() -> None:
    p = _producer()
    pool = [make_endpoint(0), make_endpoint(1)]
    await _schedule(p, _request(640), pool, pool[1])
    await _schedule(p, _request(128, first=7), pool, pool[0])
    state = p.dump_state()
    assert state["endpoints"] == [
        {"endpoint": pool[1].id, "blocks": 10},
        {"endpoint": pool[0].id, "blocks": 2},
    ]
    assert state["totalEndpoints"] == 2
    assert state["entries"] == 12


async def test_a_turn_that_extends_a_cached_prompt_matches_as_one_hashed_whole() -> None:
    # an agent's turns (each the last one plus more): the chain cache hashes only the new
    # blocks, and every turn's match is what a producer without the cache reports
    cached, plain = _producer(), _producer()
    plain.chains = ChainCache(min_blocks=10**9)  # never used
    pool = [make_endpoint(i) for i in range(3)]
    for i, n in enumerate((9_000, 9_500, 9_530, 12_000)):
        target = pool[i % 2]
        got = await _schedule(cached, _request(n), pool, target)
        assert got == await _schedule(plain, _request(n), pool, target)
    state = cached.dump_state()["hashCache"]
    assert (state["hits"], state["misses"], state["prompts"]) == (3, 1, 1)
    assert state["bytes"] == 12_000 // 64 * 64 * 4  # the last turn's whole blocks
    assert plain.dump_state()["hashCache"]["prompts"] == 0


async def test_chat_request_matches_when_token_producer_runs_first() -> None:
    tokens = TokenProducer(name="", params=TokenProducer.Params(), handle=FakeHandle())
    p = _producer()
    pool = [make_endpoint(0), make_endpoint(1)]
    system = "You are a helpful assistant. " * 40
    payload = {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}]
    }

    async def run(request_id: str, target: Endpoint) -> dict[str, PrefixMatchInfo]:
        body = RequestBody(kind="chat", payload=payload, raw=b"")
        request = make_request(request_id=request_id, target_model="m", body=body)
        await tokens.produce(request, pool)
        await p.produce(request, pool)
        p.pre_request(request, _result(target))
        return dict(request.attributes[KEY])

    await run("r1", pool[0])
    infos = await run("r2", pool[1])
    total = infos[pool[0].id].total_blocks
    assert total == 5  # 6 + 1160 + 4 + 2 bytes -> 293 pseudo-tokens -> 5 blocks of 64
    assert infos[pool[0].id].match_blocks == total
    assert infos[pool[1].id].match_blocks == 0


async def test_a_long_prompt_matches_to_its_last_whole_group_unless_the_stride_is_one() -> None:
    pool = [make_endpoint(0)]
    for stride, expected in ((8, 32), (1, 39)):
        p = _producer(indexStride=stride)
        await _schedule(p, _request(39 * 64), pool, pool[0])
        infos = await _schedule(p, _request(39 * 64), pool, pool[0])
        assert (infos[pool[0].id].match_blocks, infos[pool[0].id].total_blocks) == (expected, 39)


def test_index_stride_is_rejected_when_below_one() -> None:
    with pytest.raises(ParamError, match="indexStride must be >= 1"):
        _producer(indexStride=0)
