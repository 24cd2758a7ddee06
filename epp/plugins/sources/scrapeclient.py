"""A minimal HTTP/1.1 keep-alive GET client for ``/metrics`` scrapes.

The collector scrapes every endpoint every 50 ms, so per-scrape overhead is multiplied by
20 x endpoints per second. A general-purpose client (aiohttp) spends most of a scrape's CPU on
request/response objects, header multidicts and connection-pool bookkeeping; this client writes
one pre-built request and reads one response on a connection kept per endpoint. It supports what
model servers' ``/metrics`` answer with: ``Content-Length`` or chunked bodies, identity encoding,
HTTP and HTTPS. Anything unexpected closes the connection and raises; the next scrape reconnects.
A kept-alive connection the server closed before answering is retried once on a new connection,
so a server that has died shows in the same scrape as a refused connection (``OSError``).

Read window: after writing a request the connection stops reading (``pause_reading``) until
``READ_DELAY`` (2 ms) after the first request of the window was written; then every connection
of the window reads again. The answers of pods scraped in the same collector tick are then read
in one event-loop wake-up instead of one each (on a busy machine each wake-up of the process
costs more CPU than a scrape's own work). A scrape takes at least ``READ_DELAY``; an answer
later than that is read as it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from typing import Final, cast

_MAX_HEADER_BYTES: Final = 64 * 1024
READ_DELAY: Final = 0.002


class ScrapeError(RuntimeError):
    pass


class _StaleConnection(Exception):
    """The peer closed the connection before the first byte of the response."""


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    transport: asyncio.Transport
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class KeepAliveClient:
    def __init__(self, *, ssl_context: ssl.SSLContext | None, max_body_bytes: int) -> None:
        self._ssl = ssl_context
        self._max_body = max_body_bytes
        self._conns: dict[tuple[str, int], _Conn] = {}
        self._requests: dict[tuple[str, int, str], bytes] = {}
        self._held: list[asyncio.Transport] = []

    async def get(self, host: str, port: int, path: str) -> bytes:
        key = (host, port)
        conn = self._conns.get(key)
        if conn is not None and not conn.writer.is_closing():
            try:
                return await self._exchange(key, conn, host, port, path)
            except _StaleConnection:
                pass  # the kept-alive connection had gone: one fresh connection decides
        conn = await self._connect(host, port)
        self._conns[key] = conn
        try:
            return await self._exchange(key, conn, host, port, path)
        except _StaleConnection as exc:
            raise ScrapeError("connection closed before the response") from exc

    async def _exchange(
        self, key: tuple[str, int], conn: _Conn, host: str, port: int, path: str
    ) -> bytes:
        """One request on ``conn``; ``_StaleConnection`` when the peer closed it before
        answering a byte (a kept-alive connection the server dropped, or a dead server)."""
        async with conn.lock:
            try:
                transport = conn.transport
                transport.write(self._request(host, port, path))
                self._hold(transport)
                body, keep = await self._read_response(conn.reader)
            except BaseException:
                # A cancelled or failed exchange leaves the stream mid-response: drop it.
                self._drop(key, conn)
                raise
            if not keep:
                self._drop(key, conn)
            return body

    def _hold(self, transport: asyncio.Transport) -> None:
        """Stop reading ``transport`` until the read window open now closes."""
        transport.pause_reading()
        if not self._held:
            loop = asyncio.get_running_loop()
            loop.call_at(loop.time() + READ_DELAY, self._release)
        self._held.append(transport)

    def _release(self) -> None:
        """Close the window: its connections read again (a closed one ignores it), and the
        answers waiting in their sockets are read in the next iteration of the loop."""
        held, self._held = self._held, []
        for transport in held:
            transport.resume_reading()

    def _request(self, host: str, port: int, path: str) -> bytes:
        cached = self._requests.get((host, port, path))
        if cached is None:
            hostname = f"[{host}]" if ":" in host else host
            cached = (
                f"GET {path} HTTP/1.1\r\nHost: {hostname}:{port}\r\n"
                "User-Agent: epp-scraper\r\nAccept: text/plain\r\n\r\n"
            ).encode()
            self._requests[(host, port, path)] = cached
        return cached

    async def _connect(self, host: str, port: int) -> _Conn:
        reader, writer = await asyncio.open_connection(
            host,
            port,
            ssl=self._ssl,
            server_hostname=host if self._ssl else None,
            limit=_MAX_HEADER_BYTES,
        )
        return _Conn(reader, writer, cast(asyncio.Transport, writer.transport))

    async def _read_response(self, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _StaleConnection from exc
            raise ScrapeError("connection closed before the response") from exc
        except ConnectionResetError as exc:
            raise _StaleConnection from exc
        except asyncio.LimitOverrunError as exc:
            raise ScrapeError("response headers too large") from exc
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ScrapeError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        status = int(parts[1]) if parts[1].isdigit() else 0
        length = -1
        chunked = False
        keep = parts[0] == "HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip()
            if name == "content-length":
                length = int(value) if value.isdigit() else -2
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                keep = value.lower() != "close" and (keep or value.lower() == "keep-alive")
            elif name == "content-encoding" and value.lower() not in ("", "identity"):
                raise ScrapeError(f"unsupported content-encoding {value!r}")
        if chunked:
            body = await self._read_chunked(reader)
        elif length >= 0:
            if length > self._max_body:
                raise ScrapeError(f"payload larger than {self._max_body} bytes")
            body = await reader.readexactly(length)
        elif length == -2:
            raise ScrapeError("invalid Content-Length")
        else:
            body = await reader.read(self._max_body + 1)  # until close
            keep = False
        if len(body) > self._max_body:
            raise ScrapeError(f"payload larger than {self._max_body} bytes")
        if status != 200:
            raise ScrapeError(f"HTTP {status}")
        return body, keep

    async def _read_chunked(self, reader: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError as exc:
                raise ScrapeError("invalid chunk size") from exc
            if size == 0:
                await _skip_trailers(reader)
                return bytes(out)
            if len(out) + size > self._max_body:
                raise ScrapeError(f"payload larger than {self._max_body} bytes")
            out += await reader.readexactly(size)
            await reader.readexactly(2)

    def _drop(self, key: tuple[str, int], conn: _Conn) -> None:
        if self._conns.get(key) is conn:
            del self._conns[key]
        conn.writer.close()

    def forget(self, host: str, port: int) -> None:
        conn = self._conns.pop((host, port), None)
        if conn is not None:
            conn.writer.close()

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.writer.close()
        for conn in conns:
            with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
                await asyncio.wait_for(conn.writer.wait_closed(), 1.0)


async def _skip_trailers(reader: asyncio.StreamReader) -> None:
    while (await reader.readuntil(b"\r\n")) != b"\r\n":
        pass
