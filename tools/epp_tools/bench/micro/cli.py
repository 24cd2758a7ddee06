"""``epp bench micro``: the EPP's hot path per request, step by step, in this process.

Each step runs ``--runs`` times and the table shows the median, with a size-normalised ratio so
numbers compare across sizes:

* ``openai-parser`` ``parse_request`` of a chat body of 10 KB and of 800 KB (µs per KB);
* ``token-producer`` (``estimate`` backend) and ``approx-prefix-cache-producer`` (hashing the
  prompt's blocks and matching them against an index that holds the same prompt for one
  endpoint) on a ~195K-token chat prompt (ns per token; the producer matches at most
  ``maxPrefixTokensToMatch`` = 131072 tokens by default), as a fresh prompt (its chain cache
  empty) and as an agent's next turn (the cache holding the prompt without its last 1,300
  tokens);
* sharing one request's prefix facts with another replica or worker (``--workers``): a
  195K-token chain of 3,047 blocks, sent as its 394 indexed blocks (the first 16, then one in
  8), exported (``PendingBlocks`` add and drain), encoded and decoded as ``redis-syncer`` does
  (msgpack), and applied to the other side's index at its bound, as a fresh prompt (every block
  new, evicting as many) and as an agent's turn (every block known; µs per request and ns per
  block of the chain);
* ``Scheduler.schedule`` with the built-in default profile (what ``epp`` runs without
  ``--config-*``; ``--help`` lists its plugins and weights, read from that config) over 10, 100
  and 1000 endpoints with scraped metrics and prefix match info (µs per endpoint).

* the ext_proc wire (``epp_tools.bench.micro.wire``): the server process's CPU per request and per
  streamed response chunk, through a real server (the whole EPP, asyncio or uvloop, with or without
  TLS, and with each message sent only once the previous one is answered, as Envoy's arrive while
  tokens come slower than the EPP answers; and, for reference, an empty grpc.aio / synchronous
  grpcio servicer, the floor of a grpcio server) and a real gRPC client in this process; the
  EPP's CPU per chunk
  inside the process, without the socket and the event loop (``epp_tools.bench.micro.chunkcost``),
  and per agent's turn of 195K tokens sent as Envoy sends it (its ~780 KB body in two chunks,
  forwarded back in full-duplex replies); and the wall-clock time of each round trip before a
  lone request's first token (route, response
  headers, first chunk; ``epp_tools.bench.micro.wirelat``); and one chunk's work in process,
  and a fixed pure-Python loop, each run right after the process slept 0, 0.5, 2 and 10 ms
  (``epp_tools.bench.micro.wakeup``): what a cold start of the core adds to a message that
  arrives alone. ``--no-wire`` skips them;
* one scrape's parsing and extraction of a simulated vLLM page, the previous path
  (``promtext.parse``) and the current one (``LineCache``) side by side
  (``epp_tools.bench.micro.scrapecost``);
* idle CPU (``epp_tools.bench.micro.idle``): the EPP process with no traffic while it scrapes 4 and
  100 simulated pods every 50 ms, as a share of one core, and the scrape rate the simulators saw
  (10 s each; also skipped by ``--no-wire``);
* the asyncio floors under those rows (``epp_tools.bench.micro.floors``): a bare asyncio server's
  CPU per message answered with one read and one write (32 connections, and one message at a
  time on one), per message sent every 0.5 ms and answered or only read, and a bare asyncio
  process scraping 4 pods every 50 ms without parsing (also skipped by ``--no-wire``).

The plugins are built from the built-in default configuration through the normal loader, so the
numbers are those of the code the EPP runs. Nothing is asserted: this is a measuring tool.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from epp.plugin import CycleState, Endpoint, InferenceRequest, Metrics, TypedName
from epp.plugin.prefix import TOKENIZED_PROMPT, TokenizedPrompt
from epp.plugins.producers.prefix_index import ChainCache, PendingBlocks, PrefixIndex
from epp_tools.bench.workloads.text import words

MODEL = "sim-model"
ENDPOINT_COUNTS = (10, 100, 1000)
_CHAT_PATH = "/v1/chat/completions"
_PARSE = "openai-parser parse_request"
_LOOKUP = "prefix index match"
_SCHEDULE = "Scheduler.schedule (default profile)"


@dataclass
class MicroHandle:
    """The plugin handle of a bare pipeline: a clock, a registry and the current endpoints."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    current: Sequence[Endpoint] = ()
    instances: dict[str, Any] = field(default_factory=dict)

    def clock(self) -> float:
        return time.monotonic()

    def plugin(self, name: str) -> Any:
        return self.instances[name]

    def endpoints(self) -> Sequence[Endpoint]:
        return self.current

    def logger(self, typed_name: TypedName) -> logging.Logger:
        return logging.getLogger(f"epp.plugin.{typed_name}")

    def share_soon(self) -> None:
        """No syncer here."""

    def create_plugin(
        self, type_name: str, name: str, parameters: Mapping[str, Any] | None = None
    ) -> Any:
        from epp.config.loader import PluginFactory
        from epp.plugin.registry import PluginRegistry

        return PluginFactory(PluginRegistry.from_entry_points()).create(
            type_name, name, parameters, self
        )


@dataclass(frozen=True)
class Row:
    step: str
    size: str
    median_us: float
    ratio: float
    unit: str


def chat_body(tokens: int, seed: int = 1) -> bytes:
    """A chat completions body whose messages hold about ``tokens`` 4-byte words."""
    rng = random.Random(seed)
    system = words(rng, min(tokens // 10, 20_000))
    user = words(rng, max(1, tokens - min(tokens // 10, 20_000)))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 64, "stream": True})


def endpoints(n: int, seed: int = 1) -> list[Endpoint]:
    rng = random.Random(seed)
    return [
        Endpoint(
            id=f"default/pod-{i}-rank-0",
            name=f"pod-{i}",
            namespace="default",
            address=f"10.0.{i // 250}.{i % 250 + 1}",
            port=8000,
            metrics=Metrics(
                waiting_queue_size=rng.randrange(0, 8),
                running_requests_size=rng.randrange(0, 32),
                kv_cache_usage_percent=rng.random(),
                cache_block_size=16,
                cache_num_blocks=28_000,
                update_time=time.monotonic(),
            ),
        )
        for i in range(n)
    ]


def median_us(fn: Callable[[], object], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


async def amedian_us(fn: Callable[[], Awaitable[object]], runs: int) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        await fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


class HotPath:
    """The default pipeline's parser, producers and scheduler, loaded like the EPP loads them."""

    def __init__(self) -> None:
        from epp.config.loader import load_config
        from epp.plugin.registry import PluginRegistry
        from epp.scheduling.scheduler import Scheduler

        self.handle = MicroHandle()
        pipeline = load_config(
            None, registry=PluginRegistry.from_entry_points(), handle_for=lambda: self.handle
        )
        self.handle.instances = pipeline.instances
        self.parser = next(p for p in pipeline.parsers if p.typed_name.type == "openai-parser")
        self.producers = pipeline.producers
        self.pre_request = pipeline.pre_request
        self.scheduler = Scheduler(
            profiles=pipeline.profiles,
            handler=pipeline.profile_handler,
            observe=lambda *_: None,
            count_error=lambda *_: None,
        )

    def request(self, body: bytes) -> InferenceRequest:
        path = _CHAT_PATH
        parsed = self.parser.parse_request(path, body, {})
        return InferenceRequest(
            request_id="micro",
            headers={},
            path=path,
            incoming_model=parsed.model,
            target_model=parsed.model,
            body=parsed.body,
            size_bytes=len(body),
        )

    async def produce(self, request: InferenceRequest, eps: Sequence[Endpoint]) -> None:
        for producer in self.producers:
            await producer.produce(request, eps)


async def _producers(hot: HotPath, runs: int) -> list[Row]:
    body = chat_body(195_000)
    eps = endpoints(10)
    hot.handle.current = eps
    request = hot.request(body)
    await hot.produce(request, eps)  # warm the index: the same prompt on one endpoint
    result = hot.scheduler.schedule(CycleState(time.monotonic(), random.Random(1)), request, eps)
    for hook in hot.pre_request:
        hook.pre_request(request, result)
    tokens = len(body) // 4
    size = f"{tokens // 1000}K tokens"
    rows = []
    for producer in hot.producers:
        chains = getattr(producer, "chains", None)
        if isinstance(chains, ChainCache):  # approx-prefix-cache-producer: fresh, then a turn
            us = await _prefix_producer_us(producer, chains, request, eps, runs, turn=False)
            rows.append(Row(producer.typed_name.type, size, us, us * 1000 / tokens, "ns/token"))
            us = await _prefix_producer_us(producer, chains, request, eps, runs, turn=True)
            label = f"{size}, next turn"
            rows.append(Row(producer.typed_name.type, label, us, us * 1000 / tokens, "ns/token"))
            continue

        async def step(p: Any = producer) -> None:
            await p.produce(request, eps)

        us = await amedian_us(step, runs)
        rows.append(Row(producer.typed_name.type, size, us, us * 1000 / tokens, "ns/token"))
    return rows


TURN_TOKENS = 1_300
"""What an agent's turn adds to its context in the ``next turn`` row: the answer and a tool
result (as in ``epp bench scale``)."""


async def _prefix_producer_us(
    producer: Any,
    chains: ChainCache,
    request: InferenceRequest,
    eps: Sequence[Endpoint],
    runs: int,
    *,
    turn: bool,
) -> float:
    """The producer's time on ``request``, its chain cache emptied before each run (a fresh
    prompt) or holding the prompt without its last ``TURN_TOKENS`` (the agent's previous turn)."""
    prompt = request.attributes[TOKENIZED_PROMPT.key("token-producer")]
    previous = TokenizedPrompt((prompt.prompts[0][: -TURN_TOKENS * 4],), prompt.cache_salt)
    block_size = producer.block_size(eps)
    samples = []
    for _ in range(runs):
        chains.clear()
        if turn:
            producer.hash_prompt(request.target_model, previous, block_size)
        t0 = time.perf_counter_ns()
        await producer.produce(request, eps)
        samples.append(time.perf_counter_ns() - t0)
    chains.clear()
    return statistics.median(samples) / 1000.0


def _parse_rows(hot: HotPath, runs: int) -> list[Row]:
    rows = []
    for kb in (10, 800):
        body = chat_body(kb * 1024 // 4)
        us = median_us(partial(hot.parser.parse_request, _CHAT_PATH, body, {}), runs)
        size_kb = len(body) / 1024
        rows.append(Row(_PARSE, f"{size_kb:.0f} KB body", us, us / size_kb, "µs/KB"))
    return rows


async def _schedule_rows(hot: HotPath, runs: int) -> list[Row]:
    rows = []
    body = chat_body(2_000)
    for n in ENDPOINT_COUNTS:
        eps = endpoints(n)
        hot.handle.current = eps
        rng = random.Random(1)
        for i in range(min(n, 50)):  # some endpoints hold this prompt's prefix
            warm = hot.request(body)
            await hot.produce(warm, eps)
            result = hot.scheduler.schedule(CycleState(time.monotonic(), rng), warm, eps[i : i + 1])
            for hook in hot.pre_request:
                hook.pre_request(warm, result)
        request = hot.request(body)
        await hot.produce(request, eps)
        cycle = CycleState(time.monotonic(), rng)
        us = median_us(partial(hot.scheduler.schedule, cycle, request, eps), runs)
        rows.append(Row(_SCHEDULE, f"{n} endpoints", us, us / n, "µs/endpoint"))
    return rows


def _index_rows(runs: int) -> list[Row]:
    """Prefix-index lookup: flat in pods x indexed blocks, linear in matched blocks; and the
    measured memory per indexed block (tracemalloc)."""
    rows = []
    rng = random.Random(7)
    for pods, matched in ((10, 512), (100, 512), (1000, 512), (100, 64), (100, 2048)):
        index = PrefixIndex(default_capacity=4096)
        for p in range(pods):  # every pod holds 1,000 unrelated blocks
            index.add(f"pod-{p}", [rng.getrandbits(63) for _ in range(1000)])
        prompt = [rng.getrandbits(63) for _ in range(matched)]
        index.add("pod-0", prompt)
        us = median_us(partial(index.match, prompt), runs)
        rows.append(
            Row(_LOOKUP, f"{pods} pods, {matched} hit", us, us * 1000 / matched, "ns/matched block")
        )
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = PrefixIndex(default_capacity=200_000)
    for p in range(4):
        index.add(f"pod-{p}", [rng.getrandbits(63) for _ in range(50_000)])
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    rows.append(
        Row(
            "prefix index memory",
            f"{index.size:,} blocks",
            0.0,
            used / index.size,
            "bytes/indexed block",
        )
    )
    return rows


SHARED_BLOCKS = 3047
"""A 195K-token prompt in 64-token index blocks."""
_SHARE = "prefix sharing"


def _sharing_rows(runs: int) -> list[Row]:
    """What one routed request's prefix facts cost the replica that exports them and the one
    that applies them (``approx-prefix-cache-producer`` with a cross-replica syncer)."""
    import msgspec

    rng = random.Random(11)
    n, capacity = SHARED_BLOCKS, 8 * SHARED_BLOCKS

    def chain() -> list[int]:
        return [rng.getrandbits(64) for _ in range(n)]

    pending = PendingBlocks(65536)
    index = PrefixIndex(capacity)
    known = index.indexed(chain())  # what the routing worker sends: the chain's indexed blocks

    def export() -> object:
        pending.add("pod-0", known, capacity)
        return pending.drain()

    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(dict[str, list[Any]])
    batch = {"prefix": export()}
    for i in range(10):  # at its bound: every new block evicts one
        index.add_indexed("pod-0", known if i == 9 else index.indexed(chain()), capacity)
    fresh = [index.indexed(chain()) for _ in range(runs)]
    steps = (
        ("export", lambda: export()),
        ("encode and decode", lambda: decoder.decode(encoder.encode(batch))),
        ("apply, a turn (known)", lambda: index.add_indexed("pod-0", known, capacity)),
        ("apply, a fresh prompt", lambda: index.add_indexed("pod-0", fresh.pop(), capacity)),
    )
    rows = []
    for what, fn in steps:
        us = median_us(fn, runs)
        rows.append(Row(f"{_SHARE}: {what}", f"{n:,} blocks", us, us * 1000 / n, "ns/block"))
    return rows


async def measure(runs: int) -> list[Row]:
    hot = HotPath()
    rows = _parse_rows(hot, runs)
    rows += await _producers(hot, runs)
    rows += _sharing_rows(runs)
    rows += await _schedule_rows(hot, runs)
    rows += _index_rows(runs)
    rows += scrape_rows(runs)
    return rows


def wire_rows() -> list[Row]:
    """CPU per request and per streamed chunk of each ext_proc server (one run each: the
    figures are totals over thousands of messages, not samples)."""
    from epp_tools.bench.micro import wire

    rows = []
    for cost in wire.measure():
        label = f"ext_proc {cost.variant.label}"
        per = f"{wire.REQUESTS} req"
        rows.append(Row(label, per, cost.per_request_us, cost.per_request_us, "µs CPU/request"))
        per = f"{wire.REQUESTS * wire.CHUNKS} chunks"
        rows.append(Row(label, per, cost.per_chunk_us, cost.per_chunk_us, "µs CPU/chunk"))
    from epp_tools.bench.micro import chunkcost

    us = chunkcost.measure()
    label = "ext_proc EPP, in process, no socket"
    rows.append(Row(label, "20000 chunks", us, us, "µs CPU/chunk"))
    us = chunkcost.measure_long()
    size = f"{chunkcost.LONG_REQUESTS} 195K turns"
    rows.append(Row(label, size, us, us, "µs CPU/request"))
    return rows + latency_rows() + wakeup_rows()


def wakeup_rows() -> list[Row]:
    """One chunk's work and a fixed pure-Python loop, each right after the process slept
    (``epp_tools.bench.micro.wakeup``): what a cold start of the core adds."""
    from epp_tools.bench.micro import wakeup

    rows = []
    for cost in wakeup.measure():
        size = f"after {cost.gap_s * 1000:g} ms asleep"
        label = "ext_proc EPP, in process, one chunk"
        rows.append(Row(label, size, cost.chunk_us, cost.chunk_us, "µs CPU/chunk"))
        label = "Python floor: 300 additions"
        rows.append(Row(label, size, cost.loop_us, cost.loop_us, "µs CPU"))
    return rows


def latency_rows() -> list[Row]:
    """Wall-clock median of each ext_proc round trip before a lone request's first token
    (``epp_tools.bench.micro.wirelat``), per server."""
    from epp_tools.bench.micro import wirelat

    rows = []
    for trips in wirelat.measure():
        label = f"ext_proc round trip, {trips.variant.label}"
        for phase, us in trips.median_us.items():
            rows.append(Row(label, phase, us, us, "µs wall-clock"))
    return rows


def scrape_rows(runs: int) -> list[Row]:
    """One scrape's parsing and extraction, the previous path and the current one side by side
    (``epp_tools.bench.micro.scrapecost``); µs per scrape."""
    from epp_tools.bench.micro import scrapecost

    cases, size = scrapecost.cases(MicroHandle()), scrapecost.size()
    for _, fn in cases:
        fn()  # warm: the cache holds the page's lines, as after the first scrape of a pod
    rows = []
    for label, fn in cases:
        us = median_us(fn, runs)
        rows.append(Row(scrapecost.step(label), size, us, us, "µs/scrape"))
    return rows


def idle_rows() -> list[Row]:
    from epp_tools.bench.micro.idle import POD_COUNTS, idle_cost

    rows = []
    for pods in POD_COUNTS:
        cost = idle_cost(pods)
        label = "idle EPP, scraping every 50 ms"
        rows.append(Row(label, f"{pods} pods", 0.0, cost.share * 100.0, "% of a core"))
        expected = f"scrapes/s reached (of {cost.expected_per_s:.0f})"
        rows.append(Row(label, f"{pods} pods", 0.0, cost.scrapes_per_s, expected))
    return rows


def floor_rows() -> list[Row]:
    """What bare asyncio costs for the same traffic as two targets
    (``epp_tools.bench.micro.floors``)."""
    from epp_tools.bench.micro import floors

    us = floors.echo_us_per_message()
    rows = [Row("asyncio floor: one read, one write", "25600 messages", us, us, "µs CPU/message")]
    us = floors.echo_us_per_message(floors.LONE_MESSAGES, streams=1)
    label = "asyncio floor: the same, one at a time"
    rows.append(Row(label, f"{floors.LONE_MESSAGES} messages", us, us, "µs CPU/message"))
    pace = f"1 per {floors.PACE_S * 1000:g} ms"
    for answered, label in ((True, "answered"), (False, "read, not answered")):
        us = floors.paced_us_per_message(answered)
        rows.append(Row(f"asyncio floor: paced, {label}", pace, us, us, "µs CPU/message"))
    floor = floors.scrape_floor()
    label = "asyncio floor: bare scraper, every 50 ms"
    rows.append(Row(label, "4 pods", 0.0, floor.share * 100.0, "% of a core"))
    return rows


def table(rows: Sequence[Row], runs: int) -> str:
    head = f"{'step':<48}{'size':>16}{'median µs':>12}{'ratio':>12}  unit"
    lines = [f"EPP hot path, median of {runs} runs", head, "-" * (len(head) + 4)]
    for r in rows:
        lines.append(f"{r.step:<48}{r.size:>16}{r.median_us:>12.1f}{r.ratio:>12.3f}  {r.unit}")
    return "\n".join(lines)


def default_profile() -> str:
    """The built-in default profile's plugins, in order, scorers with their weight."""
    import yaml

    from epp.config.schema import DEFAULT_CONFIG_TEXT

    (profile,) = yaml.safe_load(DEFAULT_CONFIG_TEXT)["schedulingProfiles"]
    return ", ".join(
        " ".join(str(p[k]) for k in ("pluginRef", "weight") if k in p) for p in profile["plugins"]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="epp bench micro",
        description=f"{__doc__}\nThe built-in default profile: {default_profile()}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=30, help="runs per step (default 30)")
    p.add_argument("--no-wire", action="store_true", help="skip the ext_proc wire rows")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    logging.basicConfig(level=logging.WARNING)
    rows = asyncio.run(measure(args.runs))
    if not args.no_wire:
        rows += wire_rows()
        rows += idle_rows()
        rows += floor_rows()
    print(table(rows, args.runs))
    return 0
