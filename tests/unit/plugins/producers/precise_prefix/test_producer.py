"""The ``precise-prefix-cache-producer`` plugin and the deprecated ``precise-prefix-cache-scorer``
(events are fed directly with ``handle_batch``; ZMQ is covered by the integration tests)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from epp.plugin import (
    Consumer,
    DataProducer,
    Endpoint,
    Lifecycle,
    PrefixMatchInfo,
    PreRequest,
    ProfileResult,
    SchedulingResult,
    Scorer,
    StateDumper,
    TokenizedPrompt,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.prefix import pack_token_ids
from epp.plugins.producers.precise_prefix.events import BlockStored, EventBatch
from epp.plugins.producers.precise_prefix.producer import PrecisePrefixCacheProducer
from scorers.precise_prefix_cache import PrecisePrefixCacheScorer
from tests.builders import NOW, FakeHandle, make_cycle, make_endpoint, make_request

KEY = "PrefixCacheMatchInfo/precise-prefix-cache-producer"
TOKENS_KEY = "TokenizedPrompt/token-producer"
POOL = [make_endpoint(i) for i in range(3)]


def producer(h: FakeHandle | None = None, **params: Any) -> PrecisePrefixCacheProducer:
    params.setdefault("tokenProcessorConfig", {"blockSizeTokens": 4, "hashAlgorithm": "xxh64"})
    return PrecisePrefixCacheProducer(
        name="",
        params=decode(PrecisePrefixCacheProducer.Params, params),
        handle=h or FakeHandle(),
    )


def request(*prompts: list[int], model: str = "m", salt: str = "") -> Any:
    prompt = TokenizedPrompt.from_token_ids(prompts, cache_salt=salt)
    return make_request(target_model=model, attributes={TOKENS_KEY: prompt})


def feed(
    p: PrecisePrefixCacheProducer, endpoint: Endpoint, tokens: list[int], first: int = 1
) -> None:
    size = p.block_size
    hashes = tuple(range(first, first + len(tokens) // size))
    event = BlockStored(hashes, None, pack_token_ids(tokens), size)
    p.handle_batch(EventBatch(endpoint.id, "m", 0, 0.0, 0, (event,)))


def result(target: Endpoint) -> SchedulingResult:
    return SchedulingResult({"default": ProfileResult(targets=(target,))}, "default")


async def infos(
    p: PrecisePrefixCacheProducer, req: Any, pool: Sequence[Endpoint] = POOL
) -> dict[str, PrefixMatchInfo]:
    await p.produce(req, pool)
    return dict(req.attributes[KEY])


# ---- parameters --------------------------------------------------------------------------------


def test_defaults_follow_upstream_when_no_parameters_given() -> None:
    params = decode(PrecisePrefixCacheProducer.Params, None)
    assert params.token_processor_config.block_size_tokens == 16
    assert params.token_processor_config.hash_algorithm == "cbor-fnv"
    assert params.indexer_config.kv_block_index_config.in_memory_config.size == 100_000_000
    kv = params.kv_events_config
    assert (kv.topic_filter, kv.concurrency, kv.engine_type, kv.discover_pods) == (
        "kv@",
        4,
        "vllm",
        True,
    )
    assert kv.pod_discovery_config.socket_port == 5557
    assert (params.speculative_indexing, params.speculative_ttl) == (False, "2s")


def test_camel_case_keys_decode_when_fully_spelled_out() -> None:
    params = decode(
        PrecisePrefixCacheProducer.Params,
        {
            "tokenProcessorConfig": {
                "blockSizeTokens": 32,
                "hashSeed": "7",
                "hashAlgorithm": "xxh64",
            },
            "indexerConfig": {
                "kvBlockIndexConfig": {
                    "inMemoryConfig": {"size": 10, "podCacheSize": 2},
                    "enableMetrics": True,
                }
            },
            "kvEventsConfig": {
                "zmqEndpoint": "tcp://*:5557",
                "topicFilter": "kv@",
                "concurrency": 2,
                "engineType": "sglang",
                "discoverPods": False,
                "podDiscoveryConfig": {
                    "podLabelSelector": "app=vllm",
                    "podNamespace": "ns",
                    "socketPort": 6000,
                    "replaySocketPort": 0,
                },
            },
            "speculativeIndexing": True,
            "speculativeTTL": "500ms",
        },
    )
    assert params.kv_events_config.pod_discovery_config.socket_port == 6000
    assert params.speculative_ttl == "500ms"


@pytest.mark.parametrize(
    ("params", "match"),
    [
        pytest.param(
            {"indexerConfig": {"tokenizersPoolConfig": {}}},
            "indexerConfig\\.tokenizersPoolConfig: unkn",
            id="unknown-indexer-key",
        ),
        pytest.param(
            {"speculativeTtl": "2s"},
            "speculativeTtl: unknown field; did you mean 'speculativeTTL'",
            id="ttl-spelled-wrong",
        ),
        pytest.param(
            {"speculativeTTL": "0s"}, "speculativeTTL must be > 0, got '0s'", id="ttl-zero"
        ),
        pytest.param(
            {"speculativeTTL": "soon"},
            "invalid duration 'soon' \\(examples: 50ms, 30s, 1m30s\\)",
            id="ttl-not-duration",
        ),
        pytest.param(
            {"tokenProcessorConfig": {"hashAlgorithm": "sha256"}},
            "tokenProcessorConfig\\.hashAlgorithm: must",
            id="algorithm",
        ),
        pytest.param(
            {"tokenProcessorConfig": {"blockSizeTokens": 0}},
            "tokenProcessorConfig: blockSizeTokens mu",
            id="block-size",
        ),
        pytest.param(
            {"kvEventsConfig": {"concurrency": 0}},
            "kvEventsConfig: concurrency must be >= 1, got 0",
            id="concurrency",
        ),
        pytest.param(
            {"kvEventsConfig": {"engineType": "trtllm"}},
            "kvEventsConfig\\.engineType: must be one o",
            id="engine",
        ),
        pytest.param(
            {"kvEventsConfig": {"zmqEndpoint": "localhost:5557"}},
            "kvEventsConfig: zmqEndpoint must be a ZM",
            id="endpoint-not-url",
        ),
        pytest.param(
            {"kvEventsConfig": {"podDiscoveryConfig": {"replaySocketPort": 5558}}},
            "kvEventsConfig\\.podDiscoveryConfig: repla",
            id="replay",
        ),
        pytest.param(
            {"kvEventsConfig": {"podDiscoveryConfig": {"podLabelSelector": "=x"}}},
            "kvEventsConfig\\.podDiscoveryConfig: podLa",
            id="selector",
        ),
        pytest.param(
            {"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": 70000}}},
            "kvEventsConfig\\.podDiscoveryConfig: socke",
            id="port",
        ),
        pytest.param(
            {"indexerConfig": {"kvBlockIndexConfig": {"inMemoryConfig": {"size": 0}}}},
            "indexerConfig\\.kvBlockIndexConfig\\.inMemor",
            id="size",
        ),
    ],
)
def test_params_rejected_when_invalid(params: dict[str, Any], match: str) -> None:
    with pytest.raises(ParamError, match=match):
        decode(PrecisePrefixCacheProducer.Params, params)


def test_deprecated_block_size_applies_when_block_size_tokens_is_default() -> None:
    p = producer(tokenProcessorConfig={"blockSize": 32})
    assert p.block_size == 32


def test_plugin_fills_its_roles_when_constructed() -> None:
    p = producer()
    for role in (DataProducer, Consumer, PreRequest, Lifecycle, StateDumper):
        assert isinstance(p, role)
    assert p.produces() == frozenset({KEY})
    assert p.consumes() == frozenset({TOKENS_KEY})


# ---- matching ----------------------------------------------------------------------------------


async def test_match_info_reports_leading_blocks_per_endpoint_when_events_indexed() -> None:
    p = producer()
    feed(p, POOL[1], list(range(12)))
    feed(p, POOL[2], list(range(4)), first=100)
    assert await infos(p, request(list(range(14)))) == {
        POOL[0].id: PrefixMatchInfo(0, 3, 4),
        POOL[1].id: PrefixMatchInfo(3, 3, 4),
        POOL[2].id: PrefixMatchInfo(1, 3, 4),
    }


async def test_match_info_sums_prompts_when_request_has_several() -> None:
    p = producer()
    feed(p, POOL[0], list(range(8)))
    feed(p, POOL[0], list(range(50, 54)), first=100)
    got = await infos(p, request(list(range(8)), list(range(50, 58))))
    assert got[POOL[0].id] == PrefixMatchInfo(3, 4, 4)


@pytest.mark.parametrize(
    ("req", "expected_total"),
    [
        pytest.param(make_request(), 0, id="no-prompt"),
        pytest.param(request(list(range(4)), model="other"), 1, id="other-model"),
        pytest.param(request(list(range(4)), salt="s"), 1, id="salted"),
    ],
)
async def test_no_endpoint_matches_when_prompt_missing_or_keyed_differently(
    req: Any, expected_total: int
) -> None:
    p = producer()
    feed(p, POOL[0], list(range(4)))
    assert await infos(p, req) == dict.fromkeys(
        (ep.id for ep in POOL), PrefixMatchInfo(0, expected_total, 4)
    )


# ---- speculative indexing ------------------------------------------------------------------------


async def test_speculative_keys_route_followers_until_ttl_when_enabled() -> None:
    h = FakeHandle()
    p = producer(h, speculativeIndexing=True, speculativeTTL="2s")
    first = request(list(range(8)))
    await p.produce(first, POOL)
    p.pre_request(first, result(POOL[2]))
    assert (await infos(p, request(list(range(8)))))[POOL[2].id] == PrefixMatchInfo(2, 2, 4)
    h.now = NOW + 2.0
    assert (await infos(p, request(list(range(8)))))[POOL[2].id] == PrefixMatchInfo(0, 2, 4)


async def test_speculative_keys_survive_ttl_when_engine_confirms_them() -> None:
    h = FakeHandle()
    p = producer(h, speculativeIndexing=True)
    first = request(list(range(8)))
    await p.produce(first, POOL)
    p.pre_request(first, result(POOL[2]))
    feed(p, POOL[2], list(range(8)))
    h.now = NOW + 10.0
    assert (await infos(p, request(list(range(8)))))[POOL[2].id] == PrefixMatchInfo(2, 2, 4)


async def test_pre_request_indexes_nothing_when_speculation_disabled() -> None:
    p = producer()
    first = request(list(range(8)))
    await p.produce(first, POOL)
    p.pre_request(first, result(POOL[2]))
    assert len(p.index) == 0


# ---- subscriptions and the pool ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("discovery", "endpoint", "url"),
    [
        pytest.param({}, make_endpoint(0), "tcp://192.168.1.1:5557", id="default-port"),
        pytest.param(
            {"socketPort": 6000},
            dataclasses.replace(make_endpoint(0), rank=2),
            "tcp://192.168.1.1:6002",
            id="port-plus-rank",
        ),
        pytest.param({}, make_endpoint(0, address="fd00::1"), "tcp://[fd00::1]:5557", id="ipv6"),
        pytest.param(
            {"podLabelSelector": "app=vllm"},
            make_endpoint(0, labels={"app": "vllm"}),
            "tcp://192.168.1.1:5557",
            id="selected",
        ),
        pytest.param({"podLabelSelector": "app=vllm"}, make_endpoint(0), None, id="not-selected"),
        pytest.param(
            {"podLabelSelector": "!canary"},
            make_endpoint(0, labels={"canary": "1"}),
            None,
            id="absent-label",
        ),
        pytest.param({"podNamespace": "other"}, make_endpoint(0), None, id="other-namespace"),
    ],
)
def test_subscription_target_follows_discovery_config_when_computed(
    discovery: dict[str, Any], endpoint: Endpoint, url: str | None
) -> None:
    p = producer(kvEventsConfig={"podDiscoveryConfig": discovery})
    assert p.targets([endpoint]).get(endpoint.id) == url


@pytest.mark.parametrize(
    ("pod", "rank", "expected"),
    [
        pytest.param("default/pod-1-rank-0", None, "default/pod-1-rank-0", id="endpoint-id"),
        pytest.param("pod-1", None, "default/pod-1-rank-0", id="name"),
        pytest.param("10.0.0.9:8001", None, "dp-1", id="address-port"),
        pytest.param("10.0.0.9", 1, "dp-1", id="address-rank"),
        pytest.param("10.0.0.9", None, "dp-0", id="address-defaults-to-rank-0"),
        pytest.param("nobody", None, None, id="unknown"),
    ],
)
def test_topic_pod_resolves_to_endpoint_when_central_socket_used(
    monkeypatch: pytest.MonkeyPatch, pod: str, rank: int | None, expected: str | None
) -> None:
    h = FakeHandle()
    dp = [
        Endpoint(
            id=f"dp-{r}",
            name=f"dp-{r}",
            namespace="default",
            address="10.0.0.9",
            port=8000 + r,
            rank=r,
        )
        for r in range(2)
    ]
    monkeypatch.setattr(h, "endpoints", lambda: (*POOL, *dp))
    assert producer(h).resolve(pod, rank) == expected


def test_reconcile_forgets_endpoints_when_they_leave_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = FakeHandle()
    p = producer(h)
    feed(p, POOL[0], list(range(4)))
    feed(p, POOL[1], list(range(4)))
    monkeypatch.setattr(h, "endpoints", lambda: (POOL[1],))
    p.reconcile()
    assert p.index.block_counts() == {POOL[1].id: {"gpu": 1}}


# ---- observability -----------------------------------------------------------------------------


def test_dump_state_and_metrics_report_the_index_when_events_applied() -> None:
    h = FakeHandle()
    p = producer(h)
    feed(p, POOL[0], list(range(8)))
    p.handle_batch(
        EventBatch(
            POOL[0].id, "m", 1, 0.0, 0, (BlockStored((9,), 77, pack_token_ids(range(4)), 4),)
        )
    )
    state = p.dump_state()
    assert state["endpoints"] == [{"endpoint": POOL[0].id, "blocks": {"gpu": 2}}]
    assert state["index"]["entries"] == 2
    assert state["index"]["bytesPerBlock"] == state["index"]["approxBytes"] // 2
    assert (state["events"], state["skipped"]) == ({"stored": 1}, {"unknown_parent": 1})
    labels = {"plugin_name": "precise-prefix-cache-producer"}
    sample = h.registry.get_sample_value
    assert sample("llm_d_epp_precise_prefix_index_blocks", labels) == 2
    assert sample("llm_d_epp_kv_events_total", {**labels, "event": "stored"}) == 1
    assert sample("llm_d_epp_kv_events_skipped_total", {**labels, "reason": "unknown_parent"}) == 1


def test_two_instances_share_metric_families_when_on_one_registry() -> None:
    h = FakeHandle()
    producer(h)
    other = PrecisePrefixCacheProducer(
        name="second", params=PrecisePrefixCacheProducer.Params(), handle=h
    )
    feed(other, POOL[0], list(range(32)))
    assert (
        h.registry.get_sample_value(
            "llm_d_epp_precise_prefix_index_blocks", {"plugin_name": "second"}
        )
        == 2
    )


# ---- deprecated scorer wrapper -----------------------------------------------------------------


async def test_deprecated_scorer_produces_and_scores_when_used_alone() -> None:
    params = decode(
        PrecisePrefixCacheScorer.Params, {"tokenProcessorConfig": {"blockSizeTokens": 4}}
    )
    s = PrecisePrefixCacheScorer(name="", params=params, handle=FakeHandle())
    for role in (Scorer, DataProducer, PreRequest, Lifecycle, StateDumper):
        assert isinstance(s, role)
    assert s.produces() == frozenset({"PrefixCacheMatchInfo/precise-prefix-cache-scorer"})
    feed(s.producer, POOL[1], list(range(8)))
    req = request(list(range(16)))
    await s.produce(req, POOL)
    assert s.score(make_cycle(), req, POOL) == {POOL[0].id: 0.0, POOL[1].id: 0.5, POOL[2].id: 0.0}
