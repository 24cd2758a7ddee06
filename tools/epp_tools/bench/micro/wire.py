"""``epp bench micro`` rows for the ext_proc wire: server CPU per request and per streamed
response chunk, through a real server and a real gRPC client.

The server runs in a child process (``python -m epp_tools.bench.micro.wire <server> <loop>``):
either a whole EPP (``App``, the built-in default config, file discovery of 4 endpoints on loopback
ports that were bound and closed, scraping every 10 s so the scrapes stay out of the figure) serving
the ext_proc port, optionally over TLS, reading every response body (``--response-body-sample-ratio
1``) or, in the "bodies unread" variant, none (ratio 0: each chunk goes back untouched, as when
nothing needs the body); or, for reference, an empty ext_proc servicer on grpcio (grpc.aio, or
grpcio's synchronous server with a thread pool) that answers every message with an empty
``BodyResponse``: the floor of what a message pair costs in a grpcio server, which the EPP's own
HTTP/2 server (``epp.server.h2``) replaced. The loop is asyncio's or uvloop's.

This process is the client (grpc.aio): ``STREAMS`` concurrent streams, each a chat request
(headers, then a ~300-byte body with end of stream), the response headers, and ``chunks``
100-byte SSE chunks, the last with end of stream. The child's CPU (user + system, from
``/proc/<pid>/stat``) is read around ``REQUESTS`` requests of 1 chunk and around as many of
1 + ``CHUNKS``: per request (with one chunk) = the first / requests, per chunk = the difference /
(requests x chunks).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server import extproc_rpc

STREAMS = 32
CHUNKS = 100
REQUESTS = 1024
"""Per phase: the child's CPU is read in clock ticks (10 ms), so the per-request figure moves in
steps of 10 ms / ``REQUESTS`` (about 10 µs here; 39 µs with the 256 this used to be)."""
_TICK = os.sysconf("SC_CLK_TCK")
_CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"delta":{"content":"x"}}]}\n\n'
)


@dataclass(frozen=True)
class Variant:
    label: str
    server: str  # epp | empty-aio | empty-sync
    loop: str = "asyncio"  # asyncio | uvloop
    tls: bool = False
    unread: bool = False
    """EPP: the response bodies go back unread (``--response-body-sample-ratio 0``: nothing in
    the config needs them); otherwise the EPP reads every one (ratio 1)."""
    lockstep: bool = False
    """One stream at a time, each message written once the previous one's reply is read: every
    message reaches the server on its own, as Envoy's do while tokens come slower than the
    server answers (``LOCKSTEP_REQUESTS`` requests of 1 + ``LOCKSTEP_CHUNKS`` chunks)."""


VARIANTS = (
    Variant("empty servicer, grpc.aio", "empty-aio"),
    Variant("empty servicer, grpcio sync threads", "empty-sync"),
    Variant("EPP", "epp"),
    Variant("EPP, uvloop", "epp", "uvloop"),
    Variant("EPP, TLS", "epp", tls=True),
    Variant("EPP, bodies unread", "epp", unread=True),
    Variant("EPP, one message at a time", "epp", lockstep=True),
)
LOCKSTEP_REQUESTS = 512
LOCKSTEP_CHUNKS = 40


@dataclass(frozen=True)
class WireCost:
    variant: Variant
    per_request_us: float
    per_chunk_us: float


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def stream_messages(chunks: int) -> list[pb.ProcessingRequest]:
    body = orjson.dumps(
        {"model": "sim-model", "messages": [{"role": "user", "content": "hello " * 40}]}
    )
    hdrs = {":path": "/v1/chat/completions", ":method": "POST", "content-type": "application/json"}
    headers = pb.HeaderMap(
        headers=[pb.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs.items()]
    )
    resp = pb.HeaderMap(
        headers=[
            pb.HeaderValue(key=":status", raw_value=b"200"),
            pb.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
        ]
    )
    out = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=resp)),
    ]
    out += [
        pb.ProcessingRequest(response_body=pb.HttpBody(body=_CHUNK, end_of_stream=i == chunks - 1))
        for i in range(chunks)
    ]
    return out


async def _drive(channel: grpc.aio.Channel, requests: int, chunks: int) -> None:
    """``requests`` streams, ``STREAMS`` at a time; each must get a reply to every message but
    the request headers (the EPP answers them with the body in FULL_DUPLEX_STREAMED)."""
    call = extproc_rpc.process(channel)
    messages = stream_messages(chunks)
    todo = iter(range(requests))

    async def one() -> None:
        async def gen() -> AsyncIterator[pb.ProcessingRequest]:
            for m in messages:
                yield m

        replies = 0
        async for _ in call(gen()):
            replies += 1
        if replies < len(messages) - 1:
            raise RuntimeError(f"{replies} replies to {len(messages)} messages")

    async def lane() -> None:
        for _ in todo:
            await one()

    async with asyncio.timeout(600):
        await asyncio.gather(*(lane() for _ in range(STREAMS)))


def channel(port: int, cert: bytes | None) -> grpc.aio.Channel:
    target = f"127.0.0.1:{port}"
    if cert is None:
        return grpc.aio.insecure_channel(target)
    creds = grpc.ssl_channel_credentials(root_certificates=cert)
    override = [("grpc.ssl_target_name_override", "epp")]
    return grpc.aio.secure_channel(target, creds, options=override)


async def _lockstep(channel: grpc.aio.Channel, requests: int, chunks: int) -> None:
    """``requests`` streams one after another, each message written once the reply to the one
    before is read (the body's two replies, sent together once it routed)."""
    process = extproc_rpc.process(channel)
    headers, body, *rest = stream_messages(chunks)
    async with asyncio.timeout(600):
        for _ in range(requests):
            call = process()
            await call.write(headers)
            await call.write(body)
            for _ in range(2):
                await call.read()
            for message in rest[:-1]:
                await call.write(message)
                await call.read()
            await call.write(rest[-1])
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:  # its reply, then the stream's end
                pass


async def _measure(
    pid: int, port: int, cert: bytes | None, chunks: int, requests: int, lockstep: bool = False
) -> tuple[float, float]:
    drive = _lockstep if lockstep else _drive
    async with channel(port, cert) as ch:
        await drive(ch, STREAMS, 2)  # warm up: connections, imports, caches
        t0 = cpu_seconds(pid)
        await drive(ch, requests, 1)
        t1 = cpu_seconds(pid)
        await drive(ch, requests, 1 + chunks)
        t2 = cpu_seconds(pid)
    per_request = (t1 - t0) / requests * 1e6
    per_chunk = max(0.0, (t2 - t1) - (t1 - t0)) / (requests * chunks) * 1e6
    return per_request, per_chunk


def measure(
    variants: Sequence[Variant] = VARIANTS, chunks: int = CHUNKS, requests: int = REQUESTS
) -> list[WireCost]:
    out = []
    for v in available(variants):
        n, k = requests, chunks
        if v.lockstep:  # a round trip per message: fewer, for about the same time
            n, k = min(n, LOCKSTEP_REQUESTS), min(k, LOCKSTEP_CHUNKS)
        with serve(v) as (pid, port, cert):
            cost = asyncio.run(_measure(pid, port, cert, k, n, v.lockstep))
        out.append(WireCost(v, *cost))
    return out


def available(variants: Sequence[Variant]) -> list[Variant]:
    """The variants this machine can run (uvloop's are optional: pip install uvloop)."""
    have_uvloop = importlib.util.find_spec("uvloop") is not None
    return [v for v in variants if v.loop != "uvloop" or have_uvloop]


@contextlib.contextmanager
def serve(v: Variant) -> Iterator[tuple[int, int, bytes | None]]:
    """The variant's server in a child process: its pid, port and TLS certificate (if any)."""
    with tempfile.TemporaryDirectory() as tmp:
        tls = tmp if v.tls else ""
        module = "epp_tools.bench.micro.wire"
        cmd = [sys.executable, "-m", module, v.server, v.loop, tls, str(int(v.unread))]
        child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            cert = (Path(tmp) / "tls.crt").read_bytes() if v.tls else None
            yield child.pid, port, cert
        finally:
            child.kill()
            child.wait()


# ---- the child: one server --------------------------------------------------------------------


def _dead_ports(n: int) -> list[int]:
    ports = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return ports


def config(tmp: Path) -> str:
    lines = ["endpoints:"]
    for i, port in enumerate(_dead_ports(4)):
        lines += [f"- name: pod-{i}", "  namespace: default", "  address: 127.0.0.1"]
        lines.append(f"  port: '{port}'")
    eps = tmp / "endpoints.yaml"
    eps.write_text("\n".join(lines) + "\n")
    return (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        f"- type: file-discovery\n  parameters:\n    path: {eps}\n"
        "dataLayer:\n  discovery: {pluginRef: file-discovery}\n"
    )


async def _serve_app(tls_dir: str, unread: bool) -> None:
    from epp.app import App
    from epp.server.tls import self_signed
    from epp.settings import Settings

    with tempfile.TemporaryDirectory() as tmp:
        if tls_dir:
            cert, key = self_signed()
            (Path(tls_dir) / "tls.crt").write_bytes(cert)
            (Path(tls_dir) / "tls.key").write_bytes(key)
        settings = Settings(
            grpc_port=0,
            grpc_health_port=0,
            metrics_port=0,
            bind_address="127.0.0.1",
            secure_serving=bool(tls_dir),
            cert_path=tls_dir,
            drain_timeout=0.0,
            config_text=config(Path(tmp)),
            refresh_metrics_interval=10.0,
            response_body_sample_ratio=0.0 if unread else 1.0,
        )
        async with App(settings) as app:
            await _announce(app.grpc_port)


async def _announce(port: int) -> None:
    print(port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def _empty(requests: Any, context: Any) -> Any:
    """Answers every message with an empty response-body reply."""
    reply = pb.ProcessingResponse(response_body=pb.BodyResponse())
    for _ in requests:
        yield reply


async def _empty_aio(requests: Any, context: Any) -> Any:
    reply = pb.ProcessingResponse(response_body=pb.BodyResponse())
    async for _ in requests:
        yield reply


async def _serve_empty(sync: bool) -> None:
    if sync:
        from concurrent.futures import ThreadPoolExecutor

        srv = grpc.server(ThreadPoolExecutor(max_workers=STREAMS + 4))
        srv.add_generic_rpc_handlers((extproc_rpc.handler(_empty),))
        port = srv.add_insecure_port("127.0.0.1:0")
        srv.start()
        with contextlib.suppress(Exception):
            await _announce(port)
        srv.stop(None)
        return
    aio = grpc.aio.server()
    aio.add_generic_rpc_handlers((extproc_rpc.handler(_empty_aio),))
    port = aio.add_insecure_port("127.0.0.1:0")
    await aio.start()
    await _announce(port)
    await aio.stop(None)


def _child(argv: list[str]) -> None:
    server, loop, tls_dir, unread = argv
    logging.basicConfig(level=logging.ERROR)
    if loop == "uvloop":
        import uvloop  # type: ignore[import-not-found, unused-ignore]

        uvloop.install()
    if server.startswith("empty-"):
        asyncio.run(_serve_empty(server == "empty-sync"))
    else:
        asyncio.run(_serve_app(tls_dir, unread == "1"))


if __name__ == "__main__":
    time.sleep(0)
    _child(sys.argv[1:])
