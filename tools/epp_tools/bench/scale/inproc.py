"""A whole EPP driven in process, request by request, for the cost growth curves.

``InProcessEpp`` starts an ``App`` (the built-in default scheduling: response affinity, prefix
affinity, estimated load, KV headroom, LRU for cold requests) whose endpoints are ``pods``
synthetic pods from file discovery on loopback ports that were bound and closed, with no metrics
data source: the pods' metrics are set on the endpoint store directly (``refresh_metrics``:
queue, running requests, KV usage and a KV cache that holds every session, freshly scraped), so
nothing is scraped and the pods exist only as state. Requests go through the real ext_proc
server (``epp.server.h2conn.Connection`` and ``epp.server.h2.ExtProcCall``) with a transport that
only counts bytes, as Envoy would send them: the request headers, the body (in 64 KB messages,
each cut into 16 KB frames), then the response headers, ``chunks`` SSE chunks (the last with the
usage and, for the Responses API, the response id) and the end of the stream.

``open`` sends a request and waits until it is routed, ``close`` streams its response to the end
(``request`` does both); each returns the process CPU seconds the EPP spent (routing included,
building the frames excluded), so a caller can keep many requests in flight, as a loaded EPP has.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import orjson
import yaml

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.config.schema import DEFAULT_CONFIG_TEXT
from epp.plugin import Metrics
from epp.server import h2wire as w
from epp.server.h2 import ExtProcCall
from epp.server.h2conn import Connection
from epp.server.misuse import MisuseLog
from epp_tools.bench.micro.chunkcost import Client, CountingTransport

BODY_MESSAGE = 64 * 1024
FRAME = 16 * 1024
_SCRAPE_ONLY = ("metrics-data-source", "core-metrics-extractor")


def _dead_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(int(s.getsockname()[1]))
    return ports


def config_text(endpoints_file: Path) -> str:
    """The built-in default config without scraping, pods from ``endpoints_file``."""
    doc = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    doc["plugins"] = [p for p in doc["plugins"] if p["type"] not in _SCRAPE_ONLY]
    doc["plugins"].append({"type": "file-discovery", "parameters": {"path": str(endpoints_file)}})
    doc["dataLayer"] = {"injectDefaults": False, "discovery": {"pluginRef": "file-discovery"}}
    return str(yaml.safe_dump(doc, sort_keys=False))


def _headers(pairs: Sequence[tuple[str, str]]) -> pb.HeaderMap:
    return pb.HeaderMap(headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])


def request_messages(path: str, body: bytes) -> list[bytes]:
    """The request headers and the body as Envoy streams them (serialized messages)."""
    hdrs = _headers([(":path", path), (":method", "POST"), ("content-type", "application/json")])
    out = [pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hdrs)).SerializeToString()]
    pieces = [body[i : i + BODY_MESSAGE] for i in range(0, len(body), BODY_MESSAGE)] or [b""]
    for i, piece in enumerate(pieces):
        part = pb.HttpBody(body=piece, end_of_stream=i == len(pieces) - 1)
        out.append(pb.ProcessingRequest(request_body=part).SerializeToString())
    return out


def response_messages(chunks: Sequence[bytes]) -> list[bytes]:
    hdrs = _headers([(":status", "200"), ("content-type", "text/event-stream")])
    out = [pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=hdrs)).SerializeToString()]
    for i, chunk in enumerate(chunks):
        part = pb.HttpBody(body=chunk, end_of_stream=i == len(chunks) - 1)
        out.append(pb.ProcessingRequest(response_body=part).SerializeToString())
    return out


def _data(sid: int, payload: bytes, end: bool = False) -> bytes:
    message = w.grpc_message(payload)
    pieces = [message[i : i + FRAME] for i in range(0, len(message), FRAME)]
    frames = [w.frame(w.DATA, 0, sid, p) for p in pieces[:-1]]
    frames.append(w.frame(w.DATA, w.END_STREAM if end else 0, sid, pieces[-1]))
    return b"".join(frames)


class InProcessEpp:
    def __init__(self, pods: int, seed: int = 1) -> None:
        self.pods = pods
        self.seed = seed
        self.app: Any = None
        self.failed = 0
        self._stack = AsyncExitStack()
        self._conn: Connection | None = None
        self._sid = 1
        self._client = Client()

    async def __aenter__(self) -> InProcessEpp:
        from epp.app import App
        from epp.settings import Settings

        tmp = Path(self._stack.enter_context(tempfile.TemporaryDirectory()))
        lines = ["endpoints:"]
        for i, port in enumerate(_dead_ports(self.pods)):
            lines += [f"- name: pod-{i}", "  namespace: default", "  address: 127.0.0.1",
                      f"  port: '{port}'"]  # fmt: skip
        eps = tmp / "endpoints.yaml"
        eps.write_text("\n".join(lines) + "\n")
        settings = Settings(grpc_port=0, grpc_health_port=0, metrics_port=0,
                            bind_address="127.0.0.1", secure_serving=False, drain_timeout=0.0,
                            config_text=config_text(eps), seed=self.seed,
                            refresh_metrics_interval=10.0)  # fmt: skip
        self.app = await self._stack.enter_async_context(App(settings))
        for _ in range(200):
            if len(self.app.store) == self.pods:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"discovery found {len(self.app.store)} of {self.pods} pods")
        self.refresh_metrics()
        self._connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            self._conn.connection_lost(None)
        await self._stack.aclose()

    def _connect(self) -> None:
        misuse = MisuseLog(logging.getLogger(__name__), time.monotonic)
        ctx = self.app.context
        conn = Connection(lambda path, io: ExtProcCall(io, ctx, misuse), 1 << 26, lambda c: None)
        conn.connection_made(CountingTransport())  # type: ignore[arg-type]
        conn.data_received(Client.preface())
        self._conn = conn

    def refresh_metrics(self, kv_blocks: int = 50_000_000) -> None:
        """Every pod freshly scraped: a short queue, some running requests, KV 30-60% used, a
        KV cache of ``kv_blocks`` 16-token blocks (large enough to hold every session)."""
        now = time.monotonic()
        store = self.app.store
        for i, ep in enumerate(store.snapshot()):
            m = Metrics(
                waiting_queue_size=i % 3,
                running_requests_size=8 + i % 5,
                kv_cache_usage_percent=0.3 + 0.3 * ((i * 7) % 10) / 10,
                cache_block_size=16,
                cache_num_blocks=kv_blocks,
                update_time=now,
            )
            store.update_metrics(ep.id, m)

    async def open(self, path: str, body: bytes) -> tuple[int, float]:
        """Send a request's headers and body and wait until it is routed: (stream id or 0 when
        it was refused, the EPP's CPU seconds)."""
        conn = self._conn
        assert conn is not None
        sid, self._sid = self._sid, self._sid + 2
        first = self._client.headers(sid)
        frames = first + b"".join(_data(sid, m) for m in request_messages(path, body))
        t0 = time.process_time()
        conn.data_received(frames)
        st = conn.streams.get(sid)
        call = st.call if st is not None else None
        if isinstance(call, ExtProcCall) and call.task is not None:
            await call.task
        spent = time.process_time() - t0
        if sid not in conn.streams:  # refused: an immediate response ended the stream
            self.failed += 1
            return 0, spent
        return sid, spent

    def close(self, sid: int, chunks: Sequence[bytes]) -> float:
        """Stream the response of an open request to its end; the EPP's CPU seconds."""
        conn = self._conn
        assert conn is not None
        messages = response_messages(chunks)
        frames = b"".join(_data(sid, m, end=i == len(messages) - 1) for i, m in enumerate(messages))
        t0 = time.process_time()
        conn.data_received(frames)
        return time.process_time() - t0

    async def request(self, path: str, body: bytes, chunks: Sequence[bytes]) -> float:
        """One request from its headers to the end of its response; the EPP's CPU seconds."""
        sid, spent = await self.open(path, body)
        return spent + (self.close(sid, chunks) if sid else 0.0)


def chat_body(messages: Sequence[dict[str, str]], max_tokens: int) -> bytes:
    return orjson.dumps(
        {"model": "sim-model", "messages": list(messages), "max_tokens": max_tokens,
         "stream": True, "stream_options": {"include_usage": True}}
    )  # fmt: skip
