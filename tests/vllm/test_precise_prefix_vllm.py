"""Precise prefix routing against real vLLM: its KV events over ZMQ, its render endpoints.

Prepare once, then run (see ``tests/vllm/test_real_vllm.py``)::

    bash tests/vllm/setup_vllm.sh && .venv/bin/pytest -m vllm tests/vllm -q

Without that venv and model every test here is skipped with the reason. Two servers are started
for the module, both with ``--enable-scale-out`` (vLLM 0.32 serves ``/v1/*/render`` only then):
``pod-0`` *binds* its publisher (``tcp://*:<port>``, the EPP connects: per-endpoint layout) and
``pod-1`` *connects* to a port the EPP binds (central layout, topic ``kv@pod-1@tiny``).

What the tests show:

- the request keys the EPP computes from render's token ids equal those it computes from vLLM's
  ``BlockStored`` events, in both hash modes: the matched blocks equal the tokens vLLM's own
  prefix cache then reports as hits;
- LoRA blocks are keyed by the adapter name; ``/reset_prefix_cache`` (``AllBlocksCleared``)
  empties the endpoint;
- through the App, a prompt warmed on one server behind the EPP's back is routed to that server,
  and a repeated prompt keeps going to the server that first served it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from epp.plugin import Endpoint, PrefixMatchInfo, RequestBody
from epp.plugin.params import decode
from epp.plugins.producers.precise_prefix.producer import PrecisePrefixCacheProducer
from epp.plugins.producers.tokens import TokenProducer
from epp_tools.stack.envoy import free_port
from tests.builders import FakeHandle, make_request
from tests.conftest import body_msg, exchange, headers_msg, set_headers_of, wait_for
from tests.integration.test_kv_events_sim import precise_registry
from tests.vllm.servers import BLOCK_SIZE, LORA_NAME, SERVED_MODEL, VllmServer, missing_reason

_MISSING = missing_reason()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
]

START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
EVENT_WAIT_S = 15.0
TOKENS_KEY = "TokenizedPrompt/token-producer"
KEY = "PrefixCacheMatchInfo/precise-prefix-cache-producer"
H = {":path": "/v1/completions", ":method": "POST", "content-type": "application/json"}


@dataclass
class KvServer(VllmServer):
    """A server with the render endpoints on; ``kv_connect`` makes its publisher connect there
    instead of binding ``tcp://*:<kv_port>``."""

    kv_connect: str = ""

    def command(self) -> list[str]:
        cmd = super().command()
        at = cmd.index("--kv-events-config") + 1
        config = json.loads(cmd[at])
        if self.kv_connect:
            config["endpoint"] = self.kv_connect
        cmd[at] = json.dumps(config)
        return [*cmd, "--enable-scale-out"]

    @property
    def endpoint(self) -> Endpoint:
        """How the EPP sees this server; a binding publisher is labelled for the per-endpoint
        subscriptions (``podLabelSelector: kv-events=bind``)."""
        return Endpoint(
            id=f"default/{self.name}",
            name=self.name,
            namespace="default",
            address="127.0.0.1",
            port=self.port,
            labels={} if self.kv_connect else {"kv-events": "bind"},
        )


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[KvServer], int]]:
    """``([pod-0 (binds), pod-1 (connects)], central port)``."""
    logs = tmp_path_factory.mktemp("vllm-precise")
    ports = distinct_ports(4)
    central = ports[3]
    pool = [
        KvServer(name="pod-0", port=ports[0], kv_port=ports[1], cpu=0, log_path=logs / "pod-0.log"),
        KvServer(
            name="pod-1",
            port=ports[2],
            kv_port=0,
            cpu=1,
            log_path=logs / "pod-1.log",
            kv_connect=f"tcp://127.0.0.1:{central}",
        ),
    ]
    try:
        for server in pool:
            server.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in pool:
            server.wait_healthy(deadline)
        yield pool, central
    finally:
        for server in pool:
            server.stop()


def distinct_ports(n: int) -> list[int]:
    ports: list[int] = []
    for _ in range(50 * n):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError("no free ports")


# ---- helpers ------------------------------------------------------------------------------------


def words(tag: str, n: int) -> str:
    vocab = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "omega", "sierra", "tango")
    return tag + " " + " ".join(f"{vocab[(i * 7) % len(vocab)]}{i % 13}" for i in range(n))


async def complete(url: str, prompt: str, model: str = SERVED_MODEL) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/completions", json=body, timeout=timeout) as resp,
    ):
        text = await resp.text()
        assert resp.status == 200, text
        result: dict[str, Any] = json.loads(text)
        return result


async def prefix_hits(url: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "vllm:prefix_cache_hits_total"
    )


def stored_on(p: PrecisePrefixCacheProducer, endpoint: str) -> int:
    return sum(p.index.block_counts().get(endpoint, {}).values())


async def warm(p: PrecisePrefixCacheProducer, server: KvServer) -> None:
    """Fresh prompts until one of the server's events is indexed (PUB drops messages sent before
    the subscription reaches it)."""
    endpoint = server.endpoint.id
    for _ in range(30):
        before = stored_on(p, endpoint)
        await complete(server.url, words(uuid.uuid4().hex, 60))
        try:
            await wait_for(lambda b=before: stored_on(p, endpoint) > b, 1.0)
            return
        except TimeoutError:
            continue
    raise AssertionError(f"no KV events from {server.name}:\n{server.log_tail()}")


@pytest.fixture
async def tokens(servers: tuple[list[KvServer], int]) -> AsyncIterator[Callable[..., Any]]:
    """``await tokens(prompt, model)`` → a request carrying the engine's token ids (render)."""
    pool, _ = servers
    params = decode(
        TokenProducer.Params,
        {"backend": "vllm", "modelName": SERVED_MODEL, "vllm": {"url": pool[0].url}},
    )
    tp = TokenProducer(name="", params=params, handle=FakeHandle())

    async def render(prompt: str, model: str = SERVED_MODEL) -> Any:
        payload = {"model": model, "prompt": prompt, "max_tokens": 1}
        req = make_request(target_model=model, body=RequestBody("completions", payload, b""))
        await tp.produce(req, [])
        assert TOKENS_KEY in req.attributes
        return req

    yield render
    await tp.stop()


@pytest.fixture
async def producer(
    servers: tuple[list[KvServer], int], monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., Any]]:
    """``await producer(algorithm)`` → a started producer subscribed to both servers."""
    pool, central = servers
    started: list[PrecisePrefixCacheProducer] = []

    async def start(algorithm: str = "cbor-fnv") -> PrecisePrefixCacheProducer:
        h = FakeHandle()
        monkeypatch.setattr(h, "endpoints", lambda: (pool[0].endpoint, pool[1].endpoint))
        params = {
            "tokenProcessorConfig": {"blockSizeTokens": BLOCK_SIZE, "hashAlgorithm": algorithm},
            "kvEventsConfig": {
                "zmqEndpoint": f"tcp://127.0.0.1:{central}",
                "podDiscoveryConfig": {
                    "socketPort": pool[0].kv_port,
                    "podLabelSelector": "kv-events=bind",
                },
            },
        }
        p = PrecisePrefixCacheProducer(
            name="", params=decode(PrecisePrefixCacheProducer.Params, params), handle=h
        )
        await p.start()
        started.append(p)
        for server in pool:
            await warm(p, server)
        return p

    yield start
    for p in started:
        await p.stop()


async def match(
    p: PrecisePrefixCacheProducer, req: Any, pool: list[KvServer]
) -> dict[str, PrefixMatchInfo]:
    eps = [s.endpoint for s in pool]
    await p.produce(req, eps)
    return {s.name: req.attributes[KEY][s.endpoint.id] for s in pool}


# ---- the producer against real events -----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["cbor-fnv", "xxh64"])
async def test_matched_blocks_equal_vllm_prefix_hits_when_keys_come_from_both_sides(
    servers: tuple[list[KvServer], int],
    producer: Callable[..., Any],
    tokens: Callable[..., Any],
    algorithm: str,
) -> None:
    pool, _ = servers
    p = await producer(algorithm)
    for server in pool:
        prefix = words(f"{algorithm} {server.name} {uuid.uuid4().hex}", 400)
        before = stored_on(p, server.endpoint.id)
        await complete(server.url, prefix)
        first = await tokens(prefix)
        blocks = first.attributes[TOKENS_KEY].token_count // BLOCK_SIZE
        await wait_for(
            lambda b=before, n=blocks, s=server: stored_on(p, s.endpoint.id) >= b + n, EVENT_WAIT_S
        )
        follow_up = await tokens(prefix + " and one more question?")
        got = await match(p, follow_up, pool)
        hits_before = await prefix_hits(server.url)
        await complete(server.url, prefix + " and one more question?")
        hits = await prefix_hits(server.url) - hits_before
        other = pool[1 - pool.index(server)].name
        assert got[server.name].match_blocks >= blocks - 1 > 10
        assert got[server.name].match_blocks * BLOCK_SIZE == hits
        assert got[other].match_blocks == 0
    assert p.dump_state()["dropped"] == {}


async def test_lora_blocks_match_only_the_adapter_when_served_by_it(
    servers: tuple[list[KvServer], int], producer: Callable[..., Any], tokens: Callable[..., Any]
) -> None:
    pool, _ = servers
    p = await producer()
    prompt = words(f"lora {uuid.uuid4().hex}", 300)
    server = pool[0]
    before = stored_on(p, server.endpoint.id)
    await complete(server.url, prompt, model=LORA_NAME)
    await wait_for(lambda: stored_on(p, server.endpoint.id) > before + 5, EVENT_WAIT_S)
    lora = await match(p, await tokens(prompt, LORA_NAME), pool)
    base = await match(p, await tokens(prompt), pool)
    assert lora[server.name].match_blocks > 5
    assert base[server.name].match_blocks == 0


async def test_reset_prefix_cache_empties_the_endpoint_when_all_blocks_cleared(
    servers: tuple[list[KvServer], int], producer: Callable[..., Any], tokens: Callable[..., Any]
) -> None:
    pool, _ = servers
    p = await producer()
    server = pool[1]  # the central socket's publisher
    prompt = words(f"reset {uuid.uuid4().hex}", 300)
    await complete(server.url, prompt)
    await wait_for(lambda: stored_on(p, server.endpoint.id) > 5, EVENT_WAIT_S)
    async with aiohttp.ClientSession() as http, http.post(f"{server.url}/reset_prefix_cache") as r:
        assert r.status == 200, await r.text()
    await complete(server.url, words("flush", 10))  # vLLM publishes the reset on its next step
    await wait_for(lambda: p.dump_state()["events"].get("cleared", 0) >= 1, EVENT_WAIT_S)
    assert (await match(p, await tokens(prompt), pool))[server.name].match_blocks == 0


# ---- through the App ---------------------------------------------------------------------------

APP_CONFIG = """\
plugins:
- type: token-producer
  parameters:
    backend: vllm
    modelName: {model}
    vllm: {{url: "{render_url}", timeout: 2s}}
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSizeTokens: {block}}}
    kvEventsConfig:
      zmqEndpoint: "tcp://127.0.0.1:{central}"
      podDiscoveryConfig: {{socketPort: {kv_port}, podLabelSelector: "kv-events=bind"}}
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


async def route(app: Any, prompt: str) -> str:
    body = json.dumps({"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    replies = await exchange(app, [headers_msg(H), body_msg(body)], timeout=30)
    return set_headers_of(replies[0])["x-gateway-destination-endpoint"]


async def test_app_routes_to_the_server_holding_the_prefix_when_driven_by_real_events(
    servers: tuple[list[KvServer], int], start_app: Callable[..., Any]
) -> None:
    pool, central = servers
    config = APP_CONFIG.format(
        model=SERVED_MODEL,
        render_url=pool[0].url,
        block=BLOCK_SIZE,
        central=central,
        kv_port=pool[0].kv_port,
    )
    app = await start_app(
        [s.port for s in pool],
        config,
        labels={0: {"kv-events": "bind"}},
        registry=precise_registry(),
    )
    p: PrecisePrefixCacheProducer = app.plugin("precise-prefix-cache-producer")
    for server in pool:
        await warm(p, server)
    by_hostport = {f"127.0.0.1:{s.port}": s for s in pool}
    for server in (pool[1], pool[0]):  # warmed behind the EPP's back: only events can tell
        hidden = words(f"hidden {server.name} {uuid.uuid4().hex}", 300)
        before = stored_on(p, server.endpoint.id)
        await complete(server.url, hidden)
        await wait_for(lambda b=before, s=server: stored_on(p, s.endpoint.id) > b + 5, EVENT_WAIT_S)
        assert by_hostport[await route(app, hidden + " follow-up")] is server
    repeated = words(f"repeated {uuid.uuid4().hex}", 300)
    chosen = await route(app, repeated)
    target = by_hostport[chosen]
    before = stored_on(p, target.endpoint.id)
    await complete(target.url, repeated)
    await wait_for(lambda: stored_on(p, target.endpoint.id) > before + 5, EVENT_WAIT_S)
    assert [await route(app, repeated) for _ in range(3)] == [chosen] * 3
