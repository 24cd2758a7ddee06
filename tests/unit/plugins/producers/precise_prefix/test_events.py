"""KV-event decoding (``precise_prefix.events``, ``kvevents``) and how events change the index."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from epp.plugin.prefix import pack_token_ids
from epp.plugins.producers.precise_prefix.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedMessage,
    decode_event,
    decode_payload,
    normalize_hash,
    parse_topic,
)
from epp.plugins.producers.precise_prefix.health import EventHealth
from epp.plugins.producers.precise_prefix.index import PreciseIndex
from epp.plugins.producers.precise_prefix.ingest import (
    EventApplier,
    map_engine_hashes,
    realign_extras,
)
from epp.plugins.producers.precise_prefix.keys import KeyHasher
from epp.plugins.producers.precise_prefix.kvevents import KVEventHub
from epp_tools.stack.envoy import free_port
from tests.conftest import wait_for

EP = "default/pod-0"
MODEL = "m"

# ---- decoding ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        pytest.param("kv@pod-1@llama", ("pod-1", "llama"), id="pod-and-model"),
        pytest.param("kv@10.0.0.1@org/model@v2", ("10.0.0.1", "org/model@v2"), id="model-with-at"),
        pytest.param("kv@tiny", ("", "tiny"), id="model-only"),
        pytest.param("kv", ("", ""), id="bare"),
    ],
)
def test_topic_splits_into_pod_and_model_when_parsed(topic: str, expected: tuple[str, str]) -> None:
    assert parse_topic(topic) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(5, 5, id="uint"),
        pytest.param(2**64 - 1, 2**64 - 1, id="max-uint64"),
        pytest.param(-1, 2**64 - 1, id="int64"),
        pytest.param(b"\x00" * 24 + (7).to_bytes(8, "big"), 7, id="bytes-last-8"),
        pytest.param(b"\x01\x02", 0x0102, id="short-bytes"),
    ],
)
def test_hash_becomes_uint64_when_normalized(raw: Any, expected: int) -> None:
    assert normalize_hash(raw) == expected


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        pytest.param(b"", "empty hash bytes", id="empty-bytes"),
        pytest.param("x", "unsupported hash type str", id="str"),
        pytest.param(True, "hash is a boolean", id="bool"),
    ],
)
def test_hash_is_rejected_when_not_a_hash(raw: Any, match: str) -> None:
    with pytest.raises(MalformedMessage, match=match):
        normalize_hash(raw)


STORED = BlockStored(
    block_hashes=(11, 12),
    parent_block_hash=10,
    tokens=pack_token_ids(range(8)),
    block_size=4,
    lora_id=None,
    medium="gpu",
    lora_name=None,
    extra_keys=(None, None),
    group_idx=0,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            [
                "BlockStored",
                [11, 12],
                10,
                list(range(8)),
                4,
                None,
                "GPU",
                None,
                [None, None],
                0,
                "Full_Attention",
            ],
            dataclasses.replace(STORED, grouped=True, kv_cache_spec_kind="full_attention"),
            id="stored-array",
        ),
        pytest.param(
            {
                "type": "BlockStored",
                "block_hashes": [11, 12],
                "parent_block_hash": 10,
                "token_ids": list(range(8)),
                "block_size": 4,
                "medium": "GPU",
                "extra_keys": [None, None],
                "kv_cache_spec_kind": "full_attention",
            },
            dataclasses.replace(
                STORED, kv_cache_spec_kind="full_attention"
            ),  # no group: not grouped
            id="stored-map-missing-keys",
        ),
        pytest.param(
            ["BlockStored", [11, 12], 10, list(range(8)), 4],
            BlockStored((11, 12), 10, pack_token_ids(range(8)), 4),
            id="stored-short-array",
        ),
        pytest.param(
            {
                "type": "BlockStored",
                "block_hashes": [1],
                "parent_block_hash": None,
                "token_ids": [1, 2],
                "block_size": 2,
                "lora_id": 3,
                "lora_name": "ad",
                "extra_keys": [["ad", ["mmhash", 0], "salt"]],
            },
            BlockStored(
                (1,),
                None,
                pack_token_ids([1, 2]),
                2,
                3,
                "gpu",
                "ad",
                (("ad", ("mmhash", 0), "salt"),),
            ),
            id="stored-lora-extras",
        ),
        pytest.param(
            ["BlockRemoved", [b"\x00" * 8, -2], "CPU"],
            BlockRemoved((0, 2**64 - 2), "cpu"),
            id="removed-array",
        ),
        pytest.param(
            {"type": "BlockRemoved", "block_hashes": [3], "group_idx": 1},
            BlockRemoved((3,), "gpu", 1, grouped=True),
            id="removed-map",
        ),
        pytest.param(["AllBlocksCleared"], AllBlocksCleared(), id="cleared-array"),
        pytest.param({"type": "AllBlocksCleared"}, AllBlocksCleared(), id="cleared-map"),
        pytest.param({"type": "SomethingNew", "x": 1}, None, id="unknown-tag"),
    ],
)
def test_event_is_decoded_when_array_or_map_form(raw: Any, expected: Any) -> None:
    assert decode_event(raw) == expected


def test_sglang_bigram_tokens_are_flattened_when_engine_is_sglang() -> None:
    raw = ["BlockStored", [1], None, [[5, 6], [6, 7], [7, 8]], 4]
    event = decode_event(raw, "sglang")
    assert isinstance(event, BlockStored)
    assert event.tokens == pack_token_ids([5, 6, 7, 8])


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(["BlockStored", "not-a-list", None, [1], 1], id="hashes-not-list"),
        pytest.param(["BlockStored", [1], None, [-1], 1], id="negative-token"),
        pytest.param(["BlockStored", [1], None, [2**32], 1], id="token-too-big"),
        pytest.param(["BlockStored", [1.5], None, [1], 1], id="float-hash"),
        pytest.param([1, 2], id="untagged-array"),
        pytest.param({"block_hashes": [1]}, id="untagged-map"),
    ],
)
def test_malformed_event_is_counted_when_payload_decoded(raw: Any) -> None:
    payload = msgspec.msgpack.encode([1.0, [raw, ["AllBlocksCleared"]], 0])
    ts, rank, events, malformed = decode_payload(payload)
    assert (ts, rank, events, malformed) == (1.0, 0, [AllBlocksCleared()], 1)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        pytest.param(b"\xc1", "payload is not msgpack: MessagePack data", id="not-msgpack"),
        pytest.param(
            msgspec.msgpack.encode({"ts": 1}),
            "payload is not \\[ts, events, \\.\\.\\.\\]",
            id="not-array",
        ),
        pytest.param(
            msgspec.msgpack.encode([1.0, "events"]),
            "payload is not \\[ts, events, \\.\\.\\.\\]",
            id="events-not-list",
        ),
    ],
)
def test_message_is_rejected_when_payload_is_not_a_batch(payload: bytes, match: str) -> None:
    with pytest.raises(MalformedMessage, match=match):
        decode_payload(payload)


# ---- applying events ---------------------------------------------------------------------------


def applier(block_size: int = 4, capacity: int = 10_000) -> EventApplier:
    hasher = KeyHasher(algorithm="xxh64", block_size=block_size)
    return EventApplier(PreciseIndex(capacity), hasher, logging.getLogger("test"))


def stored(
    hashes: list[int], tokens: list[int], *, parent: int | None = None, size: int = 4, **kw: Any
) -> BlockStored:
    return BlockStored(tuple(hashes), parent, pack_token_ids(tokens), size, **kw)


def apply(a: EventApplier, *events: Any, endpoint: str = EP, model: str = MODEL) -> None:
    a.apply(EventBatch(endpoint, model, 0, 0.0, 0, tuple(events)))


def matched(
    a: EventApplier, tokens: list[int], model: str = MODEL, salt: str = ""
) -> dict[str, int]:
    h = a.hasher
    extras = [(salt,)] if salt else None
    return a.index.match(h.iter_keys(h.model_root(model), pack_token_ids(tokens), extras))


def test_stored_chain_matches_request_when_tokens_equal() -> None:
    a = applier()
    apply(a, stored([1, 2], list(range(8))))
    apply(a, stored([3], list(range(8, 12)), parent=2))
    assert matched(a, list(range(14))) == {EP: 3}
    assert matched(a, [99, *range(1, 14)]) == {}
    assert a.applied == {"stored": 2}


def test_removed_block_breaks_the_match_when_engine_evicts_it() -> None:
    a = applier()
    apply(a, stored([1, 2, 3], list(range(12))))
    apply(a, BlockRemoved((2,)))
    assert matched(a, list(range(12))) == {EP: 1}
    assert a.applied == {"stored": 1, "removed": 1}


def test_all_blocks_cleared_empties_endpoint_when_received() -> None:
    a = applier()
    apply(a, stored([1, 2], list(range(8))))
    apply(a, stored([1, 2], list(range(8))), endpoint="default/pod-1")
    apply(a, AllBlocksCleared())
    assert matched(a, list(range(8))) == {"default/pod-1": 2}


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        pytest.param(stored([1], list(range(6))), "partial_tokens", id="partial-tokens"),
        pytest.param(stored([1, 2], list(range(4))), "count_mismatch", id="hash-count-mismatch"),
        pytest.param(
            stored([1], list(range(6)), size=6), "block_size_mismatch", id="block-size-mismatch"
        ),
        pytest.param(stored([5], list(range(4)), parent=77), "unknown_parent", id="unknown-parent"),
        pytest.param(stored([], []), "empty", id="no-hashes"),
        pytest.param(stored([9], []), "unknown_tier_move", id="tokenless-unknown"),
    ],
)
def test_event_is_skipped_and_counted_when_invalid(event: BlockStored, reason: str) -> None:
    a = applier()
    apply(a, event)
    assert a.skipped == {reason: 1}
    assert len(a.index) == 0


def test_malformed_events_of_a_batch_are_counted_when_reported() -> None:
    a = applier()
    a.apply(EventBatch(EP, MODEL, 0, 0.0, None, (), malformed=3))
    assert a.skipped == {"malformed": 3}


def test_lora_name_replaces_model_when_hashing() -> None:
    a = applier()
    apply(a, stored([1], list(range(4)), lora_id=1, lora_name="ad", extra_keys=(("ad",),)))
    assert matched(a, list(range(4)), model="ad") == {EP: 1}
    assert matched(a, list(range(4)), model=MODEL) == {}


def test_salted_blocks_match_only_salted_requests_when_cache_salt_set() -> None:
    a = applier()
    apply(a, stored([1, 2], list(range(8)), extra_keys=(("s1",), None)))
    assert matched(a, list(range(8)), salt="s1") == {EP: 2}
    assert matched(a, list(range(8)), salt="s2") == {}
    assert matched(a, list(range(8))) == {}


def test_big_engine_blocks_map_to_several_request_keys_when_block_size_is_a_multiple() -> None:
    a = applier(block_size=4)
    apply(a, stored([1, 2], list(range(16)), size=8))
    assert matched(a, list(range(16))) == {EP: 4}
    apply(a, stored([3], list(range(16, 24)), parent=2, size=8))
    assert matched(a, list(range(24))) == {EP: 6}
    apply(a, BlockRemoved((2,)))
    assert matched(a, list(range(24))) == {EP: 2}


def test_small_engine_blocks_share_one_request_key_when_block_size_divides() -> None:
    a = applier(block_size=8)
    apply(a, stored([1, 2, 3], list(range(12)), size=4))  # block 3 does not complete a key
    assert matched(a, list(range(16))) == {EP: 1}
    apply(a, stored([4], list(range(12, 16)), parent=3, size=4))
    assert a.skipped == {"unknown_parent": 1}
    apply(a, stored([5, 6], list(range(8, 16)), parent=2, size=4))
    assert matched(a, list(range(16))) == {EP: 2}
    apply(a, stored([7], list(range(12, 16)), parent=5, size=4))
    assert a.skipped == {"unknown_parent": 1, "unaligned_parent": 1}


def test_tokenless_store_adds_a_tier_when_blocks_move() -> None:
    a = applier()
    apply(a, stored([1, 2], list(range(8))))
    apply(a, stored([1, 2], [], medium="cpu"))
    apply(a, BlockRemoved((1, 2)))
    assert matched(a, list(range(8))) == {EP: 2}
    assert a.index.block_counts() == {EP: {"cpu": 2}}


@pytest.mark.parametrize(
    ("hashes", "keys", "engine", "size", "pairs", "mid"),
    [
        pytest.param([1, 2], [10, 20], 4, 4, [(1, 10), (2, 20)], set(), id="one-to-one"),
        pytest.param([1], [10, 20], 8, 4, [(1, (10, 20))], set(), id="one-to-many"),
        pytest.param([1, 2, 3], [10], 4, 8, [(1, 10), (2, 10)], {1}, id="many-to-one"),
    ],
)
def test_engine_hashes_map_to_request_keys_when_block_sizes_differ(
    hashes: list[int], keys: list[int], engine: int, size: int, pairs: Any, mid: set[int]
) -> None:
    assert map_engine_hashes(hashes, keys, engine, size) == (pairs, mid)


@pytest.mark.parametrize(
    ("extras", "engine_blocks", "blocks", "expected"),
    [
        pytest.param((None, None), 2, 2, None, id="text-only"),
        pytest.param((("ad",), ("ad",)), 2, 2, None, id="lora-name-dropped"),
        pytest.param((("ad", "s"), None), 1, 2, [("s",), None], id="salt-first-sub-block"),
        pytest.param(((("h", 0),),), 1, 2, [(("h", 0),), (("h", 0),)], id="mm-every-sub-block"),
        pytest.param(
            ((("h", 0),), (("h", -4), ("g", 1))),
            2,
            1,
            [(("h", 0), ("h", -4), ("g", 1))],
            id="mm-merged",
        ),
    ],
)
def test_extras_realign_to_request_blocks_when_sizes_differ(
    extras: Any, engine_blocks: int, blocks: int, expected: Any
) -> None:
    assert realign_extras(extras, engine_blocks, blocks, "ad") == expected


# ---- the hub's bounds --------------------------------------------------------------------------


async def test_messages_are_dropped_and_counted_when_the_queue_is_full() -> None:
    drops: list[str] = []
    handled: list[EventBatch] = []
    hub = KVEventHub(
        handler=handled.append,
        resolve=lambda pod, rank: None,
        concurrency=1,
        queue_size=2,
        on_drop=drops.append,
    )
    payload = msgspec.msgpack.encode([0.0, [["AllBlocksCleared"]], 0])
    frames = [b"kv@p@m", (0).to_bytes(8, "big"), payload]
    for _ in range(5):  # no worker is running: the backlog cannot grow past the bound
        hub._enqueue(EP, frames)
    assert drops == ["queue_full"] * 3
    await hub.start()
    try:
        await wait_for(lambda: len(handled) == 2)
    finally:
        await hub.stop()
    assert [b.endpoint for b in handled] == [EP, EP]
    assert handled[0].events == (AllBlocksCleared(),)


# ---- KV-event health (``health``) ---------------------------------------------------------------

PLUGIN = {"plugin_name": "pp"}


def healthy_applier() -> tuple[EventApplier, CollectorRegistry]:
    registry = CollectorRegistry()
    hasher = KeyHasher(algorithm="xxh64", block_size=4)
    health = EventHealth(registry, "pp")
    return EventApplier(
        PreciseIndex(10_000), hasher, logging.getLogger("t"), None, health
    ), registry


def test_groups_of_non_prefix_kinds_are_skipped_and_counted_when_the_model_is_hybrid() -> None:
    a, registry = healthy_applier()
    sample = registry.get_sample_value
    full = {"grouped": True, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    window = {"grouped": True, "group_idx": 1, "kv_cache_spec_kind": "sliding_window"}
    apply(a, stored([1, 2], list(range(8)), **full), stored([51, 52], list(range(8)), **window))
    apply(a, stored([53], list(range(8, 12)), parent=52, grouped=True, group_idx=1))  # kind learned
    assert matched(a, list(range(8))) == {EP: 2}  # only the full-attention group is indexed
    stores = "llm_d_epp_kv_cache_events_stores_skipped_total"
    reason = {"reason": "unsupported_cache_kind"}
    assert sample(stores, {**PLUGIN, "cache_kind": "sliding_window", **reason}) == 2
    apply(
        a,
        BlockRemoved((51,), group_idx=1, grouped=True),
        BlockRemoved((9,), group_idx=7, grouped=True),
    )
    removals = "llm_d_epp_kv_cache_events_removals_skipped_total"
    assert sample(removals, {**PLUGIN, "cache_kind": "sliding_window", **reason}) == 1
    assert sample(removals, {**PLUGIN, "cache_kind": "unknown", "reason": "unknown_group"}) == 1
    apply(a, stored([60], list(range(4)), grouped=True, group_idx=3))  # a group of no known kind
    assert sample(stores, {**PLUGIN, "cache_kind": "unknown", **reason}) == 1


def test_removals_of_a_block_announced_twice_are_deduplicated_and_counted() -> None:
    a, registry = healthy_applier()
    apply(a, stored([1, 2], list(range(8))), stored([1], list(range(4))))  # block 1 re-announced
    apply(a, BlockRemoved((1, 2, 99)))  # 1 absorbed by its second announcement; 2 and 99 pass
    assert matched(a, list(range(8))) == {EP: 1}
    total = registry.get_sample_value
    new, old = (
        "llm_d_epp_kv_cache_events_dedup_removed_hashes",
        "kvcache_kvevents_dedup_removed_hashes",
    )
    for family in (new, old):
        assert total(f"{family}_suppressed_total", PLUGIN) == 1
        assert total(f"{family}_forwarded_total", PLUGIN) == 2
    apply(a, BlockRemoved((1,)))
    assert matched(a, list(range(8))) == {}
    assert total(f"{new}_forwarded_total", PLUGIN) == 3


async def test_hub_reports_messages_queue_and_socket_failures_to_health() -> None:
    registry = CollectorRegistry()
    health = EventHealth(registry, "pp")
    handled: list[EventBatch] = []
    hub = KVEventHub(
        handler=handled.append,
        resolve=lambda pod, rank: None,
        concurrency=2,
        reconnect_interval=0.05,
        health=health,
    )
    sample = registry.get_sample_value
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    port = free_port()
    pub.bind(f"tcp://127.0.0.1:{port}")
    await hub.start()
    try:
        assert sample("llm_d_epp_kv_cache_events_pool_capacity", PLUGIN) == 2
        hub.set_targets({EP: f"tcp://127.0.0.1:{port}"})
        payload = msgspec.msgpack.encode([0.0, [["AllBlocksCleared"]], 0])
        seq = 0

        async def received() -> bool:
            nonlocal seq
            await pub.send_multipart([b"kv@p@m", seq.to_bytes(8, "big"), payload])
            seq += 1
            return bool(handled)

        async with asyncio.timeout(10):
            while not await received():  # PUB drops what it sends before the subscription lands
                await asyncio.sleep(0.02)
        messages = "llm_d_epp_kv_cache_events_messages_received_total"
        await wait_for(lambda: sample(messages, {**PLUGIN, "pod_identifier": EP}) == len(handled))
        assert sample("llm_d_epp_kv_cache_events_pool_queue_depth", PLUGIN) == 0
        hub.bind("tcp://256.0.0.1:1")  # no such address: bind fails, and is retried
        bad = {**PLUGIN, "pod_identifier": "tcp://256.0.0.1:1"}
        errors = "llm_d_epp_kv_cache_events_zmq_errors_total"
        reconnections = "llm_d_epp_kv_cache_events_subscriber_reconnections_total"
        await wait_for(lambda: (sample(reconnections, bad) or 0) >= 1)
        assert (sample(errors, {**bad, "operation": "bind"}) or 0) >= 1
        hub.set_targets({})  # the endpoint's subscription goes, and its series with it
        assert sample(messages, {**PLUGIN, "pod_identifier": EP}) is None
    finally:
        await hub.stop()
        pub.close(linger=0)
        ctx.term()
