"""KV-cache events from model servers over ZMQ: the subscriber sockets and workers (spec §4.9).

Messages are decoded by ``events`` (wire format there).

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
slow subscriber or a reconnect): it is logged and reported with ``on_gap``. Messages received,
socket failures (by operation), sockets recreated and the queue depth go to ``health``
(``epp.plugins.producers.precise_prefix.health``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable, Mapping
from typing import Final

import zmq
import zmq.asyncio

from epp.plugins.producers.precise_prefix.events import (
    EngineType,
    EventBatch,
    MalformedMessage,
    decode_payload,
    parse_topic,
)
from epp.plugins.producers.precise_prefix.health import EventHealth

RECONNECT_INTERVAL: Final = 5.0
QUEUE_SIZE: Final = 4096
RECEIVE_HWM: Final = 10000
MAX_TRACKED_STREAMS: Final = 10000
_YIELD_EVERY: Final = 64


class _SocketError(Exception):
    """Setting up a socket failed at ``operation`` (``subscribe``, ``bind`` or ``connect``)."""

    def __init__(self, operation: str, cause: Exception) -> None:
        super().__init__(f"{operation}: {cause}")
        self.operation = operation


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
        health: EventHealth | None = None,
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
        self._health = health
        self._depth = 0

    async def start(self) -> None:
        if self._ctx is not None:
            return
        self._ctx = zmq.asyncio.Context()
        if self._health is not None:
            self._health.capacity(len(self._queues))
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
        self._depth = 0
        if self._health is not None:
            self._health.queue_depth(0)
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
                if self._health is not None:
                    self._health.forget(endpoint)
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
        """A SUB socket on ``url``; a failure raises ``_SocketError`` naming the operation."""
        assert self._ctx is not None, "start() first"
        sock = self._ctx.socket(zmq.SUB)
        operation = "subscribe"
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(self._reconnect * 1000))
            if "[" in url or url.count(":") > 2:
                sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.SUBSCRIBE, self._filter)
            operation = "bind" if bind else "connect"
            if bind:
                sock.bind(url)
                last = sock.getsockopt(zmq.LAST_ENDPOINT)
                self.bound_endpoint = last.decode() if isinstance(last, bytes) else str(last)
            else:
                sock.connect(url)
        except (zmq.ZMQError, OSError) as exc:
            sock.close(linger=0)
            raise _SocketError(operation, exc) from exc
        return sock

    async def _receive(self, endpoint: str | None, url: str, *, bind: bool) -> None:
        """Receive until cancelled; a failing socket is recreated after the reconnect interval."""
        name = endpoint or url
        failed = False
        while True:
            sock: zmq.asyncio.Socket | None = None
            try:
                if failed and self._health is not None:
                    self._health.reconnection(name)
                sock = self._socket(url, bind=bind)
                if endpoint is not None:
                    self.subscribed.add(endpoint)
                self._log.info("KV events: %s %s", "listening on" if bind else "subscribed to", url)
                while True:
                    frames = await sock.recv_multipart()
                    self._enqueue(endpoint, frames, name)
            except asyncio.CancelledError:
                raise
            except (_SocketError, zmq.ZMQError, OSError) as exc:
                failed = True
                operation = exc.operation if isinstance(exc, _SocketError) else "recv"
                if self._health is not None:
                    self._health.error(name, operation)
                self._log.warning(
                    "KV events from %s: %s failed: %s; retrying in %.1fs",
                    name,
                    operation,
                    exc.__cause__ if isinstance(exc, _SocketError) else exc,
                    self._reconnect,
                )
            finally:
                if sock is not None:
                    sock.close(linger=0)
                if endpoint is not None:
                    self.subscribed.discard(endpoint)
            await asyncio.sleep(self._reconnect)

    def _enqueue(self, endpoint: str | None, frames: list[bytes], source: str = "") -> None:
        # Shard by the publisher (endpoint, or topic on the central socket) to keep its order.
        health = self._health
        if health is not None:
            health.message(source or endpoint or "")
        shard_key = endpoint.encode() if endpoint is not None else frames[0]
        queue = self._queues[zlib.crc32(shard_key) % len(self._queues)]
        try:
            queue.put_nowait((endpoint, frames))
        except asyncio.QueueFull:
            self._on_drop("queue_full")
            return
        self._depth += 1
        if health is not None:
            health.queue_depth(self._depth)

    async def _work(self, queue: asyncio.Queue[tuple[str | None, list[bytes]]]) -> None:
        handled = 0
        while True:
            endpoint, frames = await queue.get()
            self._depth -= 1
            if self._health is not None:
                self._health.queue_depth(self._depth)
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
