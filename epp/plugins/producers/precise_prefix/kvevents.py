"""KV-cache events from model servers over ZMQ: sockets, framing and decoding (spec §4.9).

Wire format (vLLM's ``ZmqEventPublisher``; SGLang uses the same): 3-frame messages
``[topic, seq, payload]`` with ``topic`` = ``kv@<pod-id>@<model>``, ``seq`` an 8-byte big-endian
counter per publisher and ``payload`` the msgpack array ``[ts, events, data_parallel_rank]``.
Each event is a positional array with its tag first (older vLLM, SGLang) or a map tagged by
``"type"`` (vLLM ≥ 0.11, fields equal to their default omitted: a missing key reads as nil)::

    BlockStored      [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
                      medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind, ...]
    BlockRemoved     [tag, block_hashes, medium, group_idx]
    AllBlocksCleared [tag]

Hashes may be unsigned or signed 64-bit integers or bytes (the last 8 bytes, big-endian);
``medium`` is lower-cased (default ``gpu``); SGLang's bigram ``token_ids`` (``[[t0, t1], [t1,
t2], …]``) are flattened. A malformed event is skipped and counted; a malformed payload drops the
message.

Two socket layouts (the publisher's rule: it binds when its endpoint has ``*`` or ``::`` or is
ipc/inproc, otherwise it connects):

- per endpoint (``set_targets``): a SUB socket *connects* to each endpoint's publisher; the
  events belong to that endpoint whatever the topic says.
- central (``bind``): one SUB socket *binds* and every publisher connects to it (llm-d's
  indexer layout); the topic's pod field names the endpoint (``resolve``).

Reliability and bounds: ZMQ reconnects a dropped connection by itself (after 100 ms, backing off
to ``reconnect_interval``); a socket that fails (e.g. the bind address is taken) is recreated
every ``reconnect_interval`` seconds (5). Received messages go to ``concurrency`` bounded queues,
sharded by source so one endpoint's events stay in order; a full queue drops the message
(``on_drop("queue_full")``) instead of growing, and the socket's receive high-water mark bounds
what ZMQ buffers. A jump in a publisher's sequence number is a gap (messages lost to the HWM, a
slow subscriber or a reconnect): it is logged and reported with ``on_gap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec
import zmq
import zmq.asyncio

from epp.plugin.prefix import pack_token_ids

EngineType = Literal["vllm", "sglang"]
DEFAULT_TIER: Final = "gpu"
MASK64: Final = 0xFFFFFFFFFFFFFFFF
RECONNECT_INTERVAL: Final = 5.0
QUEUE_SIZE: Final = 4096
RECEIVE_HWM: Final = 10000
MAX_TRACKED_STREAMS: Final = 10000
_YIELD_EVERY: Final = 64

ExtraKey = str | tuple[str, int]


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    tokens: bytes
    """Token ids packed as little-endian uint32 (``len(tokens) // 4`` tokens)."""
    block_size: int
    lora_id: int | None = None
    medium: str = DEFAULT_TIER
    lora_name: str | None = None
    extra_keys: tuple[tuple[ExtraKey, ...] | None, ...] | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = DEFAULT_TIER
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    medium: str | None = None


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded message, attributed to an endpoint."""

    endpoint: str
    model: str
    """Base model from the topic (``""`` when the topic has none)."""
    seq: int
    ts: float
    dp_rank: int | None
    events: tuple[KVEvent, ...]
    malformed: int = 0
    """Events of the message that could not be decoded (skipped)."""


class MalformedMessage(ValueError):
    pass


# ---- decoding ---------------------------------------------------------------------------------

_FIELD_ORDER: Final[Mapping[str, tuple[str, ...]]] = {
    "BlockStored": (
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
        "group_idx",
    ),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
_DECODER: Final = msgspec.msgpack.Decoder()


def parse_topic(topic: str) -> tuple[str, str]:
    """``kv@<pod>@<model>`` → ``(pod, model)``; ``kv@<model>`` → ``("", model)``."""
    parts = topic.split("@")
    if len(parts) >= 3:
        return parts[1], "@".join(parts[2:])
    if len(parts) == 2:
        return "", parts[1]
    return "", ""


def normalize_hash(value: Any) -> int:
    """uint64 / int64 / bytes (last 8 bytes, big-endian) → unsigned 64-bit int."""
    if isinstance(value, bool):
        raise MalformedMessage("hash is a boolean")
    if isinstance(value, int):
        return value & MASK64
    if isinstance(value, (bytes, bytearray)):
        if not value:
            raise MalformedMessage("empty hash bytes")
        return int.from_bytes(bytes(value[-8:]), "big")
    raise MalformedMessage(f"unsupported hash type {type(value).__name__}")


def decode_payload(
    payload: bytes, engine: EngineType = "vllm"
) -> tuple[float, int | None, list[KVEvent], int]:
    """``[ts, events, dp_rank?]`` → ``(ts, dp_rank, events, malformed event count)``."""
    try:
        batch = _DECODER.decode(payload)
    except (msgspec.DecodeError, ValueError) as exc:
        raise MalformedMessage(f"payload is not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise MalformedMessage("payload is not [ts, events, ...]")
    ts = batch[0] if isinstance(batch[0], (int, float)) else 0.0
    rank = batch[2] if len(batch) > 2 and isinstance(batch[2], int) else None
    events: list[KVEvent] = []
    malformed = 0
    for raw in batch[1]:
        try:
            event = decode_event(raw, engine)
        except (MalformedMessage, TypeError, ValueError, OverflowError):
            malformed += 1
            continue
        if event is not None:
            events.append(event)
    return float(ts), rank, events, malformed


def decode_event(raw: Any, engine: EngineType = "vllm") -> KVEvent | None:
    """One event (array or map form) → a typed event; ``None`` for an unknown tag."""
    fields: Mapping[str, Any]
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag = raw[0]
        fields = dict(zip(_FIELD_ORDER.get(tag, ()), raw[1:], strict=False))
    elif isinstance(raw, Mapping) and isinstance(raw.get("type"), str):
        tag, fields = raw["type"], raw
    else:
        raise MalformedMessage("event is neither a tagged array nor a tagged map")
    if tag == "BlockStored":
        return _stored(fields, engine)
    if tag == "BlockRemoved":
        return BlockRemoved(
            block_hashes=_hashes(fields.get("block_hashes")),
            medium=_medium(fields.get("medium")),
            group_idx=_int_or(fields.get("group_idx"), 0),
        )
    if tag == "AllBlocksCleared":
        medium = fields.get("medium")
        return AllBlocksCleared(medium=medium.lower() if isinstance(medium, str) else None)
    return None


def _stored(fields: Mapping[str, Any], engine: EngineType) -> BlockStored:
    parent = fields.get("parent_block_hash")
    lora_name = fields.get("lora_name")
    lora_id = fields.get("lora_id")
    return BlockStored(
        block_hashes=_hashes(fields.get("block_hashes")),
        parent_block_hash=None if parent is None else normalize_hash(parent),
        tokens=_tokens(fields.get("token_ids"), engine),
        block_size=_int_or(fields.get("block_size"), 0),
        lora_id=lora_id if isinstance(lora_id, int) and not isinstance(lora_id, bool) else None,
        medium=_medium(fields.get("medium")),
        lora_name=lora_name if isinstance(lora_name, str) and lora_name else None,
        extra_keys=_extra_keys(fields.get("extra_keys")),
        group_idx=_int_or(fields.get("group_idx"), 0),
    )


def _hashes(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise MalformedMessage("block_hashes is not a list")
    return tuple(normalize_hash(v) for v in value)


def _tokens(value: Any, engine: EngineType) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, list):
        raise MalformedMessage("token_ids is not a list")
    if engine == "sglang" and value and isinstance(value[0], list):
        # EAGLE speculative decoding reports overlapping pairs: [[t0, t1], [t1, t2], ...]
        flat = [value[0][0], *(pair[1] for pair in value)]
        return pack_token_ids(flat)
    return pack_token_ids(value)  # TypeError / OverflowError on non-uint32 values


def _medium(value: Any) -> str:
    return value.lower() if isinstance(value, str) and value else DEFAULT_TIER


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _extra_keys(value: Any) -> tuple[tuple[ExtraKey, ...] | None, ...] | None:
    """Per-block extra keys: strings stay, ``[hash, offset]`` pairs become tuples, anything
    else becomes its text so that it still distinguishes the block."""
    if not isinstance(value, list):
        return None
    out: list[tuple[ExtraKey, ...] | None] = []
    for block in value:
        if not isinstance(block, list) or not block:
            out.append(None)
            continue
        items: list[ExtraKey] = []
        for item in block:
            if isinstance(item, str):
                items.append(item)
            elif (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], int)
            ):
                items.append((item[0], item[1]))
            else:
                items.append(repr(item))
        out.append(tuple(items))
    return tuple(out)


# ---- sockets ----------------------------------------------------------------------------------


def tcp_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"tcp://{host}:{port}"


Resolver = Callable[[str, int | None], str | None]
"""``(topic pod field, data-parallel rank)`` → endpoint id, for the central socket."""


class KVEventHub:
    """Owns the SUB sockets and the workers that decode messages and call ``handler``."""

    def __init__(
        self,
        *,
        handler: Callable[[EventBatch], None],
        resolve: Resolver,
        topic_filter: str = "kv@",
        engine: EngineType = "vllm",
        concurrency: int = 4,
        queue_size: int = QUEUE_SIZE,
        reconnect_interval: float = RECONNECT_INTERVAL,
        logger: logging.Logger | None = None,
        on_drop: Callable[[str], None] | None = None,
        on_gap: Callable[[str, int], None] | None = None,
    ) -> None:
        if concurrency < 1 or queue_size < 1 or reconnect_interval <= 0:
            raise ValueError("concurrency, queue_size and reconnect_interval must be positive")
        self._handler = handler
        self._resolve = resolve
        self._filter = topic_filter.encode()
        self._engine: EngineType = engine
        self._reconnect = reconnect_interval
        self._log = logger or logging.getLogger(__name__)
        self._on_drop = on_drop or (lambda reason: None)
        self._on_gap = on_gap or (lambda endpoint, missed: None)
        self._queues: list[asyncio.Queue[tuple[str | None, list[bytes]]]] = [
            asyncio.Queue(maxsize=max(1, queue_size // concurrency)) for _ in range(concurrency)
        ]
        self._ctx: zmq.asyncio.Context | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._receivers: dict[str, tuple[str, asyncio.Task[None]]] = {}
        self._central: tuple[str, asyncio.Task[None]] | None = None
        self._last_seq: dict[tuple[str, str], int] = {}
        self.bound_endpoint = ""
        self.subscribed: set[str] = set()
        """Endpoints with a live SUB socket (connected or reconnecting)."""
        self._warned: set[tuple[str, str]] = set()
        self.messages = 0

    async def start(self) -> None:
        if self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        self._workers = [
            asyncio.create_task(self._work(q), name=f"kv-events-worker-{i}")
            for i, q in enumerate(self._queues)
        ]

    async def stop(self) -> None:
        tasks = [t for _, t in self._receivers.values()] + self._workers
        if self._central is not None:
            tasks.append(self._central[1])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._receivers.clear()
        self._workers = []
        self._central = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def bind(self, url: str) -> None:
        """Listen on ``url`` for publishers that connect (the central layout)."""
        if self._central is not None and self._central[0] == url:
            return
        if self._central is not None:
            self._central[1].cancel()
        task = asyncio.create_task(self._receive(None, url, bind=True), name=f"kv-events {url}")
        self._central = (url, task)

    def set_targets(self, targets: Mapping[str, str]) -> None:
        """Subscribe to exactly ``targets`` (endpoint id → publisher URL to connect to)."""
        for endpoint, (url, task) in list(self._receivers.items()):
            if targets.get(endpoint) != url:
                task.cancel()
                del self._receivers[endpoint]
                self.subscribed.discard(endpoint)
        for endpoint, url in targets.items():
            if endpoint not in self._receivers:
                task = asyncio.create_task(
                    self._receive(endpoint, url, bind=False), name=f"kv-events {endpoint}"
                )
                self._receivers[endpoint] = (url, task)
        live = set(targets)
        for stream in [s for s in self._last_seq if self._central is None and s[0] not in live]:
            del self._last_seq[stream]

    def targets(self) -> dict[str, str]:
        return {endpoint: url for endpoint, (url, _) in self._receivers.items()}

    # ---- receiving ----------------------------------------------------------------------------

    def _socket(self, url: str, *, bind: bool) -> zmq.asyncio.Socket:
        assert self._ctx is not None, "start() first"
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(self._reconnect * 1000))
        if "[" in url or url.count(":") > 2:
            sock.setsockopt(zmq.IPV6, 1)
        sock.setsockopt(zmq.SUBSCRIBE, self._filter)
        if bind:
            sock.bind(url)
            last = sock.getsockopt(zmq.LAST_ENDPOINT)
            self.bound_endpoint = last.decode() if isinstance(last, bytes) else str(last)
        else:
            sock.connect(url)
        return sock

    async def _receive(self, endpoint: str | None, url: str, *, bind: bool) -> None:
        """Receive until cancelled; a failing socket is recreated after the reconnect interval."""
        name = endpoint or url
        while True:
            sock: zmq.asyncio.Socket | None = None
            try:
                sock = self._socket(url, bind=bind)
                if endpoint is not None:
                    self.subscribed.add(endpoint)
                self._log.info("KV events: %s %s", "listening on" if bind else "subscribed to", url)
                while True:
                    frames = await sock.recv_multipart()
                    self._enqueue(endpoint, frames)
            except asyncio.CancelledError:
                raise
            except (zmq.ZMQError, OSError) as exc:
                self._log.warning(
                    "KV events from %s: %s; retrying in %.1fs", name, exc, self._reconnect
                )
            finally:
                if sock is not None:
                    sock.close(linger=0)
                if endpoint is not None:
                    self.subscribed.discard(endpoint)
            await asyncio.sleep(self._reconnect)

    def _enqueue(self, endpoint: str | None, frames: list[bytes]) -> None:
        # Shard by the publisher (endpoint, or topic on the central socket) to keep its order.
        shard_key = endpoint.encode() if endpoint is not None else frames[0]
        queue = self._queues[zlib.crc32(shard_key) % len(self._queues)]
        try:
            queue.put_nowait((endpoint, frames))
        except asyncio.QueueFull:
            self._on_drop("queue_full")

    async def _work(self, queue: asyncio.Queue[tuple[str | None, list[bytes]]]) -> None:
        handled = 0
        while True:
            endpoint, frames = await queue.get()
            try:
                self._process(endpoint, frames)
            except Exception:
                self._log.exception("KV events: handler failed")
                self._on_drop("handler_error")
            handled += 1
            if handled % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a backlog must not starve the request path

    def _process(self, endpoint: str | None, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._on_drop("malformed")
            return
        self.messages += 1
        topic = frames[0].decode(errors="replace")
        seq = int.from_bytes(frames[1], "big")
        pod, model = parse_topic(topic)
        try:
            ts, rank, events, malformed = decode_payload(frames[2], self._engine)
        except MalformedMessage as exc:
            self._log.debug("KV events: malformed payload on %s: %s", topic, exc)
            self._on_drop("malformed")
            return
        target = endpoint if endpoint is not None else self._resolve(pod, rank)
        if target is None:
            self._on_drop("unknown_source")
            return
        self._check_sequence(target, topic, seq)
        self._handler(EventBatch(target, model, seq, ts, rank, tuple(events), malformed))

    def _check_sequence(self, endpoint: str, topic: str, seq: int) -> None:
        stream = (endpoint, topic)
        last = self._last_seq.get(stream)
        if last is None and len(self._last_seq) >= MAX_TRACKED_STREAMS:
            self._last_seq.clear()
        self._last_seq[stream] = seq
        if last is None or seq == last + 1:
            return
        if seq > last + 1:
            missed = seq - last - 1
            # Warn once per stream; the counter keeps the total.
            level = logging.DEBUG if stream in self._warned else logging.WARNING
            if len(self._warned) < MAX_TRACKED_STREAMS:
                self._warned.add(stream)
            self._log.log(
                level, "KV events from %s (%s): %d messages lost", endpoint, topic, missed
            )
            self._on_gap(endpoint, missed)
        else:
            self._log.info("KV events from %s (%s): sequence restarted at %d", endpoint, topic, seq)
