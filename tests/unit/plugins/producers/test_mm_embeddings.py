"""``mm-embeddings-cache-producer``: media items, the per-endpoint LRU, notifications, metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from xxhash import xxh64_intdigest

from epp.plugin import (
    DataProducer,
    EncoderCacheMatchInfo,
    EndpointEvent,
    EndpointEventType,
    EndpointExtractor,
    MatchItem,
    PreRequest,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    StateDumper,
)
from epp.plugin.params import ParamError, decode
from epp.plugin.testing import check_plugin_class
from epp.plugins.producers.mm_embeddings import (
    SWEEP_INTERVAL,
    MMEmbeddingsCacheProducer,
    request_items,
)
from tests.builders import FakeHandle, make_endpoint, make_request

KEY = "MultiModalEncoderCacheMatchInfoKey/mm-embeddings-cache-producer"
POOL = [make_endpoint(i) for i in range(3)]


class PoolHandle(FakeHandle):
    pool: tuple[Any, ...] = tuple(POOL)

    def endpoints(self) -> tuple[Any, ...]:
        return self.pool


def producer(h: FakeHandle | None = None, **params: Any) -> MMEmbeddingsCacheProducer:
    decoded = decode(MMEmbeddingsCacheProducer.Params, params)
    return MMEmbeddingsCacheProducer(name="", params=decoded, handle=h or FakeHandle())


def chat(*urls: str, text: str = "describe") -> Any:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    payload = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return make_request(body=RequestBody("chat", payload, b"{}"))


def sent_to(p: MMEmbeddingsCacheProducer, req: Any, *targets: Any) -> None:
    p.pre_request(req, SchedulingResult({"d": ProfileResult(targets=targets)}, "d"))


def hexhash(content: str) -> str:
    return format(xxh64_intdigest(content.encode()), "x")


# ---- contract and parameters ------------------------------------------------------------------


def test_plugin_fills_producer_prerequest_extractor_and_dumper_roles() -> None:
    check_plugin_class(MMEmbeddingsCacheProducer, "mm-embeddings-cache-producer")
    p = producer()
    for role in (DataProducer, PreRequest, EndpointExtractor, StateDumper):
        assert isinstance(p, role)
    assert p.produces() == {KEY}


@pytest.mark.parametrize(
    ("params", "items"),
    [
        pytest.param({}, 2048, id="default-4GiB"),
        pytest.param({"cacheSizeInMBPerServer": 2048}, 1024, id="per-server"),
        pytest.param({"cacheSizeInMB": 2048}, 1024, id="older-name"),
        pytest.param({"cacheSizeInMBPerServer": -5}, 2048, id="non-positive-is-default"),
        pytest.param({"cacheSizeInMBPerServer": 1}, 1, id="at-least-one"),
    ],
)
def test_lru_capacity_is_budget_over_two_mebibytes(params: dict[str, Any], items: int) -> None:
    assert producer(**params).capacity == items


def test_two_budget_names_that_disagree_are_rejected() -> None:
    with pytest.raises(ParamError, match="disagree"):
        decode(MMEmbeddingsCacheProducer.Params, {"cacheSizeInMB": 1, "cacheSizeInMBPerServer": 2})
    with pytest.raises(ParamError, match="unknown field"):
        decode(MMEmbeddingsCacheProducer.Params, {"cacheSize": 1})


# ---- items --------------------------------------------------------------------------------------


def test_items_of_chat_are_distinct_media_blocks_hashed_like_upstream() -> None:
    payload = {
        "messages": [
            {"role": "system", "content": "plain text has no media"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
                    {"type": "image_url", "image_url": {"url": "http://x/a.png"}},
                    {"type": "video_url", "video_url": {"url": "http://x/v.mp4"}},
                    {"type": "input_audio", "input_audio": {"data": "QUJD", "format": "wav"}},
                    {"type": "image_url", "image_url": {"url": ""}},
                ],
            },
        ]
    }
    items = request_items(RequestBody("chat", payload, b""))
    assert items == (
        MatchItem(hexhash("http://x/a.png"), 1, "image"),
        MatchItem(hexhash("http://x/v.mp4"), 1, "video"),
        MatchItem(hexhash("QUJDwav"), 1, "audio"),
    )


def test_items_of_anthropic_messages_include_tool_result_images() -> None:
    image = {"type": "image", "source": {"type": "base64", "data": "iVBOR"}}
    payload = {
        "messages": [
            {"role": "user", "content": [image]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "content": [{"type": "image", "source": {"url": "u"}}]}
                ],
            },
        ]
    }
    items = request_items(RequestBody("anthropic-messages", payload, b""))
    assert [i.hash for i in items] == [hexhash("iVBOR"), hexhash("u")]
    assert request_items(RequestBody("completions", {"prompt": "x"}, b"")) == ()
    assert request_items(None) == ()


# ---- matching and learning --------------------------------------------------------------------


async def test_match_info_reflects_endpoints_the_items_were_sent_to() -> None:
    p = producer()
    first = chat("http://x/a.png", "http://x/b.png")
    await p.produce(first, POOL)
    infos = first.attributes[KEY]
    assert set(infos) == {ep.id for ep in POOL}
    assert all(i.matched_items == () and i.total_size == 2 for i in infos.values())
    sent_to(p, first, POOL[1])
    second = chat("http://x/a.png", "http://x/c.png")
    await p.produce(second, POOL)
    got: dict[str, EncoderCacheMatchInfo] = second.attributes[KEY]
    assert [i.hash for i in got[POOL[1].id].matched_items] == [hexhash("http://x/a.png")]
    assert (got[POOL[1].id].matched_size, got[POOL[1].id].total_size) == (1, 2)
    assert got[POOL[0].id].matched_size == 0


async def test_request_without_media_gets_no_attribute_and_teaches_nothing() -> None:
    p = producer()
    req = chat()
    assert p.compute(req, POOL) is None
    assert KEY not in req.attributes
    sent_to(p, req, POOL[0])
    assert p.caches == {}


async def test_lru_forgets_least_recently_sent_items_beyond_capacity() -> None:
    p = producer(cacheSizeInMBPerServer=4)  # 2 items per endpoint
    for url in ("a", "b", "a", "c"):  # "a" refreshed, so "b" is the oldest when "c" comes
        req = chat(url)
        await p.produce(req, POOL)
        sent_to(p, req, POOL[0])
    assert list(p.caches[POOL[0].id]) == [hexhash("a"), hexhash("c")]


async def test_removed_endpoint_forgets_its_cache_when_notified() -> None:
    p = producer()
    req = chat("a")
    await p.produce(req, POOL)
    sent_to(p, req, POOL[0], POOL[1])
    p.extract_endpoint(EndpointEvent(EndpointEventType.ADD_OR_UPDATE, POOL[0]))
    assert set(p.caches) == {POOL[0].id, POOL[1].id}
    p.extract_endpoint(EndpointEvent(EndpointEventType.DELETE, POOL[0]))
    assert set(p.caches) == {POOL[1].id}


async def test_sweep_drops_endpoints_that_left_the_pool_every_two_minutes() -> None:
    h = PoolHandle()
    p = producer(h)
    req = chat("a")
    await p.produce(req, POOL)
    sent_to(p, req, POOL[2])
    h.pool = tuple(POOL[:2])
    sent_to(p, req, POOL[0])
    assert POOL[2].id in p.caches  # not yet: the sweep runs every 2 minutes
    h.now += SWEEP_INTERVAL
    sent_to(p, req, POOL[0])
    assert set(p.caches) == {POOL[0].id}
    h.pool = ()
    h.now += SWEEP_INTERVAL
    sent_to(p, req, POOL[1])
    assert set(p.caches) == {POOL[0].id, POOL[1].id}  # an empty pool sweeps nothing


async def test_metrics_count_queries_hits_by_pod_and_hit_ratio() -> None:
    h = PoolHandle()
    p = producer(h)
    req = chat("a", "b")
    await p.produce(req, POOL)
    sent_to(p, req, POOL[0])
    await p.produce(chat("a"), POOL)
    sample = h.registry.get_sample_value
    labels = {"plugin_type": p.TYPE, "plugin_name": p.TYPE}
    assert sample("llm_d_epp_encoder_cache_queries_total", {**labels, "modality": "image"}) == 3
    hits = {**labels, "pod": POOL[0].id, "modality": "image"}
    assert sample("llm_d_epp_encoder_cache_hits_total", hits) == 1
    assert sample("llm_d_epp_encoder_cache_hit_ratio_count", labels) == 6
    assert sample("llm_d_epp_encoder_cache_hit_ratio_bucket", {**labels, "le": "0.0"}) == 5
    p.extract_endpoint(EndpointEvent(EndpointEventType.DELETE, POOL[0]))
    assert sample("llm_d_epp_encoder_cache_hits_total", hits) is None
    state = p.dump_state()
    assert (state["totalPods"], state["totalKnownPods"], state["itemsPerPod"]) == (0, 3, 2048)


def test_endpoint_rename_keeps_nothing_stale() -> None:
    p = producer()
    moved = dataclasses.replace(POOL[0], address="10.9.9.9")
    p.extract_endpoint(EndpointEvent(EndpointEventType.DELETE, moved))
    assert p.caches == {}
