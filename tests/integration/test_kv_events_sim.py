"""Precise prefix routing from real KV events: simulated pods publish over ZMQ (vLLM's format),
``precise-prefix-cache-producer`` subscribes (both socket layouts), indexes and routes."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from epp.config.loader import load_config
from epp.plugin import Endpoint, PrefixMatchInfo, TokenizedPrompt
from epp.plugin.params import decode
from epp.plugin.registry import GROUP, PluginInfo, PluginRegistry
from epp.plugins.producers.precise_prefix.producer import PrecisePrefixCacheProducer
from epp_tools.sim.config import PodConfig
from epp_tools.sim.fleet import SimFleet
from epp_tools.sim.kvcache import chain_hashes
from epp_tools.sim.tokenizer import tokenize
from epp_tools.stack.envoy import free_port
from tests.builders import FakeHandle, make_request
from tests.conftest import body_msg, exchange, headers_msg, set_headers_of, wait_for

MODEL = "sim-model"
BLOCK = 16
KEY = "PrefixCacheMatchInfo/precise-prefix-cache-producer"
TOKENS_KEY = "TokenizedPrompt/token-producer"
H = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}
OURS = {
    "precise-prefix-cache-producer": (
        "epp.plugins.producers.precise_prefix.producer:PrecisePrefixCacheProducer"
    ),
    "precise-prefix-cache-scorer": "scorers.precise_prefix_cache:PrecisePrefixCacheScorer",
}


def precise_registry() -> PluginRegistry:
    """The installed plugins plus the precise ones (in case this checkout's entry points are not
    installed yet)."""
    base = PluginRegistry.from_entry_points()
    infos = [base.info(t) for t in base.types()]
    for name, target in OURS.items():
        if name not in base:
            ep = metadata.EntryPoint(name, target, GROUP)
            infos.append(PluginInfo(name, target, "inference-epp", "dev", ep))
    return PluginRegistry(infos)


def prompt(tag: str, words: int = 120) -> str:
    """A long prompt; different tags share no leading block."""
    return f"{tag}: " + " ".join(f"word{i % 17}" for i in range(words))


async def complete(url: str, text: str) -> None:
    body = {"model": MODEL, "prompt": text, "max_tokens": 1}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200, await r.text()


def stored_on(p: PrecisePrefixCacheProducer, endpoint: str) -> int:
    return p.index.block_counts().get(endpoint, {}).get("gpu", 0)


async def warm(p: PrecisePrefixCacheProducer, url: str, endpoint: str) -> None:
    """Send fresh prompts until one of the pod's events arrives: PUB drops what it sends before
    the subscription reaches it, as vLLM's publisher does."""
    for _ in range(40):
        before = stored_on(p, endpoint)
        await complete(url, prompt(uuid.uuid4().hex))
        try:
            await wait_for(lambda b=before: stored_on(p, endpoint) > b, 0.25)
            return
        except TimeoutError:
            continue
    raise AssertionError(f"no KV events from {endpoint}")


async def lookup(
    p: PrecisePrefixCacheProducer, text: str, pool: Sequence[Endpoint]
) -> dict[str, PrefixMatchInfo]:
    tokens = TokenizedPrompt.from_token_ids([tokenize(text)])
    req = make_request(target_model=MODEL, attributes={TOKENS_KEY: tokens})
    await p.produce(req, pool)
    return dict(req.attributes[KEY])


def pool_of(fleet: SimFleet, ranks: bool) -> tuple[Endpoint, ...]:
    return tuple(
        Endpoint(
            id=f"default/pod-{i}",
            name=f"pod-{i}",
            namespace="default",
            address="127.0.0.1",
            port=port,
            rank=i if ranks else 0,
        )
        for i, port in enumerate(fleet.ports)
    )


@pytest.fixture
async def precise(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Callable[..., Any]]:
    """``await precise(params, pool)`` → a started producer whose pool is ``pool``."""
    started: list[PrecisePrefixCacheProducer] = []

    async def start(params: dict[str, Any], pool: Sequence[Endpoint]) -> PrecisePrefixCacheProducer:
        h = FakeHandle()
        monkeypatch.setattr(h, "endpoints", lambda: pool)
        p = PrecisePrefixCacheProducer(
            name="", params=decode(PrecisePrefixCacheProducer.Params, params), handle=h
        )
        await p.start()
        started.append(p)
        return p

    yield start
    for p in started:
        await p.stop()


# ---- the producer against simulated pods -------------------------------------------------------


@pytest.mark.parametrize(
    "layout", [pytest.param("pods-bind", id="pods-bind"), pytest.param("epp-binds", id="epp-binds")]
)
async def test_shared_prefix_matches_the_pod_that_served_it_when_events_arrive(
    sim_pods: Callable[..., Any], precise: Callable[..., Any], layout: str
) -> None:
    base = free_port()
    if layout == "pods-bind":
        # each pod binds <port + i>; the producer connects to address:socketPort + rank
        fleet = SimFleet(
            [
                PodConfig(
                    name=f"pod-{i}", time_scale=50.0, kv_events_endpoint=f"tcp://*:{base + i}"
                )
                for i in range(3)
            ]
        )
        params = {"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": base}}}
    else:
        # the producer binds one socket, every pod connects to it
        fleet = SimFleet(
            [
                PodConfig(
                    name=f"pod-{i}", time_scale=50.0, kv_events_endpoint=f"tcp://127.0.0.1:{base}"
                )
                for i in range(3)
            ]
        )
        params = {
            "kvEventsConfig": {"zmqEndpoint": f"tcp://127.0.0.1:{base}", "discoverPods": False}
        }
    async with fleet:
        pool = pool_of(fleet, ranks=layout == "pods-bind")
        p = await precise(params, pool)
        for i in range(3):
            await warm(p, fleet.urls[i], pool[i].id)
        shared = prompt("shared")
        blocks = len(tokenize(shared)) // BLOCK
        before = stored_on(p, pool[1].id)
        await complete(fleet.urls[1], shared + " first question")
        await wait_for(lambda: stored_on(p, pool[1].id) >= before + blocks)
        got = await lookup(p, shared + " another question", pool)
    total = len(tokenize(shared + " another question")) // BLOCK
    assert got[pool[1].id].match_blocks >= blocks
    assert got[pool[0].id] == got[pool[2].id] == PrefixMatchInfo(0, total, BLOCK)
    state = p.dump_state()
    assert state["dropped"] == {} and state["lostMessages"] == 0
    assert state["skipped"].get("partial_tokens", 0) == 0


async def test_index_mirrors_the_engine_cache_when_blocks_are_evicted_and_reset(
    sim_pods: Callable[..., Any], precise: Callable[..., Any]
) -> None:
    fleet = await sim_pods(1, num_gpu_blocks=24, kv_events_endpoint="tcp://127.0.0.1:*")
    port = int(str(fleet.kv_endpoint(0)).rsplit(":", 1)[1])
    pool = pool_of(fleet, ranks=False)
    p = await precise({"kvEventsConfig": {"podDiscoveryConfig": {"socketPort": port}}}, pool)
    await warm(p, fleet.urls[0], pool[0].id)
    await reset(fleet.urls[0])  # blocks stored before the subscription are gone on both sides
    await wait_for(lambda: stored_on(p, pool[0].id) == 0)
    engine = fleet.runtime(0).engine
    prompts = [prompt(tag, 80) for tag in ("first", "second", "third", "fourth")]
    for text in prompts:  # 8 blocks each into a 24-block pool: the engine must evict
        await complete(fleet.urls[0], text)

    async def index_and_engine() -> tuple[list[int], list[int]]:
        seen = [(await lookup(p, text, pool))[pool[0].id].match_blocks for text in prompts]
        cached = [engine.pool.match_prefix(chain_hashes(tokenize(t), BLOCK, None)) for t in prompts]
        return [*seen, stored_on(p, pool[0].id)], [*cached, engine.pool.cached_blocks]

    # Equal counts alone can be a moment between two event batches (the last prompt's stores seen,
    # its evictions not yet), so wait until every prompt's match agrees as well.
    async with asyncio.timeout(30):
        while (got := await index_and_engine())[0] != got[1]:
            await asyncio.sleep(0.02)
    assert engine.pool.evictions > 0
    assert p.dump_state()["events"]["removed"] > 0
    assert got[0][0] == 0 and got[0][3] == 8  # the oldest prompt went first, the newest stayed
    await reset(fleet.urls[0])
    await wait_for(lambda: stored_on(p, pool[0].id) == 0)
    assert p.dump_state()["events"]["cleared"] == 2


async def reset(url: str) -> None:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/reset_prefix_cache") as r:
        assert r.status == 200, await r.text()


async def test_gaps_and_unknown_pods_are_counted_when_messages_are_lost(
    precise: Callable[..., Any],
) -> None:
    port = free_port()
    pool = (
        Endpoint(
            id="default/pod-0", name="pod-0", namespace="default", address="127.0.0.1", port=1
        ),
    )
    p = await precise(
        {"kvEventsConfig": {"zmqEndpoint": f"tcp://127.0.0.1:{port}", "discoverPods": False}}, pool
    )
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(f"tcp://127.0.0.1:{port}")
    payload = b"\x93\xcb" + b"\x00" * 8 + b"\x90\x00"  # msgpack [0.0, [], 0]
    try:
        for _ in range(100):  # until the connection carries messages
            await pub.send_multipart([b"kv@pod-0@m", (0).to_bytes(8, "big"), payload])
            await asyncio.sleep(0.02)
            if p.hub is not None and p.hub.messages:
                break
        seen = p.hub.messages if p.hub else 0
        for seq in (10, 11, 20):
            await pub.send_multipart([b"kv@pod-0@m", seq.to_bytes(8, "big"), payload])
        await pub.send_multipart([b"kv@nobody@m", (0).to_bytes(8, "big"), payload])
        await pub.send_multipart([b"kv@pod-0@m", b"short", payload])
        await wait_for(
            lambda: p.hub is not None and p.hub.messages >= seen + 4 and len(p.dropped) == 2
        )
    finally:
        pub.close()
        ctx.term()
    assert p.lost == 9 + 8
    assert p.dropped == {"unknown_source": 1, "malformed": 1}


# ---- through the App ---------------------------------------------------------------------------

APP_CONFIG = """\
plugins:
- type: token-producer
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: 16}}
    kvEventsConfig: {{zmqEndpoint: "tcp://127.0.0.1:{port}", discoverPods: false}}
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: queue-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


async def route(app: Any, text: str) -> str:
    body = json.dumps({"model": MODEL, "prompt": text, "max_tokens": 1}).encode()
    replies = await exchange(app, [headers_msg(H), body_msg(body)])
    return set_headers_of(replies[0])["x-gateway-destination-endpoint"]


async def test_app_routes_prompts_to_the_pod_holding_their_blocks_when_events_flow(
    sim_pods: Callable[..., Any], start_app: Callable[..., Any]
) -> None:
    port = free_port()
    fleet = await sim_pods(3, kv_events_endpoint=f"tcp://127.0.0.1:{port}")
    app = await start_app(fleet.ports, APP_CONFIG.format(port=port), registry=precise_registry())
    p: PrecisePrefixCacheProducer = app.plugin("precise-prefix-cache-producer")
    ids = [f"default/pod-{i}" for i in range(3)]
    for i in range(3):
        await warm(p, fleet.urls[i], ids[i])
    by_hostport = {f"127.0.0.1:{port}": i for i, port in enumerate(fleet.ports)}

    # Warmed behind the EPP's back: only the KV events can tell it where the prefix lives.
    hidden = prompt("hidden")
    before = stored_on(p, ids[2])
    await complete(fleet.urls[2], hidden)
    await wait_for(lambda: stored_on(p, ids[2]) >= before + len(tokenize(hidden)) // BLOCK)
    assert by_hostport[await route(app, hidden + " and a follow-up")] == 2

    # A repeated long prompt sticks to wherever it was first served.
    repeated = prompt("repeated", 200)
    chosen = await route(app, repeated)
    before = stored_on(p, ids[by_hostport[chosen]])
    await complete(f"http://{chosen}", repeated)
    blocks = len(tokenize(repeated)) // BLOCK
    await wait_for(lambda: stored_on(p, ids[by_hostport[chosen]]) >= before + blocks)
    assert [await route(app, repeated) for _ in range(4)] == [chosen] * 4


@pytest.mark.parametrize("name", ["prefix-precise.yaml", "prefix-estimate.yaml"])
def test_example_config_wires_the_prefix_producers_when_loaded(name: str) -> None:
    text = (Path(__file__).parents[2] / "deploy" / "configs" / name).read_text()
    pipeline = load_config(text, registry=precise_registry(), handle_for=FakeHandle)
    producers = [p.typed_name.type for p in pipeline.producers]
    expected = "precise" if "precise" in name else "approx"
    assert producers == ["token-producer", f"{expected}-prefix-cache-producer"]
