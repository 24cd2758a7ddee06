"""KV events over real ZMQ sockets, in vLLM's frame and payload format."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio

from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet

MODEL = "kv-model"


@pytest.fixture
def zctx() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def receive_until_stored(
    sub: zmq.asyncio.Socket, url: str, attempts: int = 20
) -> list[bytes]:
    """Send fresh prompts until a message arrives (PUB drops messages sent before the
    subscription propagates, exactly like vLLM)."""
    async with aiohttp.ClientSession() as http:
        for i in range(attempts):
            body = {"model": MODEL, "prompt": f"{i:04d}" * 40, "max_tokens": 1}
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                assert resp.status == 200
            if await sub.poll(200):
                frames: list[bytes] = await sub.recv_multipart()
                return frames
    raise AssertionError("no KV event received")


def check_frames(frames: list[bytes], pod: str) -> list[dict[str, Any]]:
    assert len(frames) == 3
    topic, seq, payload = frames
    assert topic == f"kv@{pod}@{MODEL}".encode()
    assert len(seq) == 8
    assert int.from_bytes(seq, "big") >= 0
    ts, events, dp_rank = msgspec.msgpack.decode(payload)
    assert isinstance(ts, float)
    assert dp_rank == 0
    assert isinstance(events, list) and events
    return list(events)


def check_block_stored(event: dict[str, Any]) -> None:
    assert event["type"] == "BlockStored"
    assert event["block_size"] == 16
    assert event["medium"] == "GPU"
    assert event["lora_id"] is None
    assert len(event["token_ids"]) == 16 * len(event["block_hashes"])
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in event["block_hashes"])


async def test_pod_binds_and_subscriber_connects_when_endpoint_has_wildcard(
    zctx: zmq.asyncio.Context,
) -> None:
    config = PodConfig(
        name="kv-bind", model=MODEL, time_scale=200.0, kv_events_endpoint="tcp://127.0.0.1:*"
    )
    async with SimFleet([config]) as fleet:
        endpoint = fleet.kv_endpoint(0)
        assert endpoint is not None and not endpoint.endswith(":*")
        sub = zctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sub.connect(endpoint)
        try:
            events = check_frames(await receive_until_stored(sub, fleet.urls[0]), "kv-bind")
        finally:
            sub.close()
    stored = events[0]
    check_block_stored(stored)
    assert stored["parent_block_hash"] is None  # a fresh prompt starts a new chain


async def test_pod_connects_and_subscriber_binds_when_endpoint_is_concrete(
    zctx: zmq.asyncio.Context,
) -> None:
    sub = zctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.bind("tcp://127.0.0.1:*")
    endpoint = sub.getsockopt_string(zmq.LAST_ENDPOINT)
    configs = [
        PodConfig(name=f"kv-c{i}", model=MODEL, time_scale=200.0, kv_events_endpoint=endpoint)
        for i in range(2)
    ]
    try:
        async with SimFleet(configs) as fleet:
            first = await receive_until_stored(sub, fleet.urls[0])
            second = await receive_until_stored(sub, fleet.urls[1])
    finally:
        sub.close()
    check_block_stored(check_frames(first, "kv-c0")[0])
    check_block_stored(check_frames(second, "kv-c1")[0])


async def test_eviction_and_reset_publish_removal_events_when_cache_churns(
    zctx: zmq.asyncio.Context,
) -> None:
    config = PodConfig(
        name="kv-small",
        model=MODEL,
        time_scale=200.0,
        num_gpu_blocks=12,
        kv_events_endpoint="tcp://127.0.0.1:*",
    )
    async with SimFleet([config]) as fleet:
        sub = zctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(str(fleet.kv_endpoint(0)))
        try:
            await receive_until_stored(sub, fleet.urls[0])  # the pipe is live from here on
            async with aiohttp.ClientSession() as http:
                for i in range(4):  # 10 blocks each: the 12-block pool must evict
                    body = {"model": MODEL, "prompt": f"{i:08d}" * 80, "max_tokens": 1}
                    async with http.post(f"{fleet.urls[0]}/v1/completions", json=body) as r:
                        assert r.status == 200
                async with http.post(f"{fleet.urls[0]}/reset_prefix_cache") as r:
                    assert r.status == 200
            types: list[str] = []
            seqs: list[int] = []
            for _ in range(100):
                if not await sub.poll(300):
                    break
                _topic, seq, payload = await sub.recv_multipart()
                seqs.append(int.from_bytes(seq, "big"))
                types += [e["type"] for e in msgspec.msgpack.decode(payload)[1]]
        finally:
            sub.close()
    assert "BlockRemoved" in types
    assert types[-1] == "AllBlocksCleared"
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # consecutive sequence numbers
