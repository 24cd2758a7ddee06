from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.plugins.sources import scrapeclient
from epp.plugins.sources.scrapeclient import KeepAliveClient, ScrapeError
from tests.conftest import CLOCK_STEP


@pytest.fixture
async def raw_server() -> AsyncIterator[tuple[int, list[bytes], list[int]]]:
    """A loopback TCP server answering each request with the next canned response."""
    responses: list[bytes] = []
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while responses:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(responses.pop(0))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield port, responses, connections
    server.close()
    await server.wait_closed()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def test_reuses_one_connection_for_consecutive_scrapes(raw_server) -> None:
    port, responses, connections = raw_server
    responses += [ok(b"a 1\n"), ok(b"a 2\n"), ok(b"a 3\n")]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    bodies = [await client.get("127.0.0.1", port, "/metrics") for _ in range(3)]
    assert bodies == [b"a 1\n", b"a 2\n", b"a 3\n"]
    assert len(connections) == 1
    await client.close()


async def test_reads_chunked_bodies(raw_server) -> None:
    port, responses, _ = raw_server
    responses.append(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n"
    )
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    assert await client.get("127.0.0.1", port, "/metrics") == b"abcdefg"
    await client.close()


@pytest.mark.parametrize(
    ("response", "message"),
    [
        pytest.param(b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", "HTTP 500", id="status"),
        pytest.param(ok(b"x" * 2000), "larger than", id="too-large"),
        pytest.param(b"SSH-2.0-nope\r\n\r\n", "not an HTTP", id="not-http"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx",
            "content-encoding",
            id="gzip",
        ),
    ],
)
async def test_bad_responses_raise_and_reconnect_next_time(
    raw_server, response: bytes, message: str
) -> None:
    port, responses, connections = raw_server
    responses += [response, ok(b"fine")]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    with pytest.raises(ScrapeError, match=message):
        await client.get("127.0.0.1", port, "/metrics")
    if not responses:  # the server closed after the last canned response
        responses.append(ok(b"fine"))
    assert await client.get("127.0.0.1", port, "/metrics") == b"fine"
    assert len(connections) == 2
    await client.close()


async def test_cancelled_scrape_drops_the_half_read_connection(raw_server) -> None:
    port, responses, connections = raw_server
    responses += [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", ok(b"next")]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await client.get("127.0.0.1", port, "/metrics")
    responses[:] = [ok(b"next")]
    assert await client.get("127.0.0.1", port, "/metrics") == b"next"
    assert len(connections) == 2
    await client.close()


async def test_server_closing_a_kept_alive_connection_costs_no_failed_scrape(raw_server) -> None:
    port, responses, connections = raw_server
    responses.append(ok(b"one"))  # the server closes once its canned responses are used up
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    assert await client.get("127.0.0.1", port, "/metrics") == b"one"
    await asyncio.sleep(0)  # let the server's close reach the client
    responses.append(ok(b"two"))
    assert await client.get("127.0.0.1", port, "/metrics") == b"two"
    assert len(connections) == 2
    await client.close()


async def test_connection_close_answer_opens_a_new_connection_next_time(raw_server) -> None:
    port, responses, connections = raw_server
    responses += [
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\none",
        ok(b"two"),
    ]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    assert await client.get("127.0.0.1", port, "/metrics") == b"one"
    responses[:] = [ok(b"two")]
    assert await client.get("127.0.0.1", port, "/metrics") == b"two"
    assert len(connections) == 2
    await client.close()


async def test_body_without_length_is_read_until_the_server_closes(raw_server) -> None:
    port, responses, _ = raw_server
    responses.append(b"HTTP/1.0 200 OK\r\n\r\nuntil close")
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    assert await client.get("127.0.0.1", port, "/metrics") == b"until close"
    await client.close()


async def test_chunked_body_over_the_limit_is_refused(raw_server) -> None:
    port, responses, _ = raw_server
    chunk = b"x" * 600
    responses.append(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"258\r\n"
        + chunk
        + b"\r\n258\r\n"
        + chunk
        + b"\r\n0\r\n\r\n"
    )
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    with pytest.raises(ScrapeError, match="larger than 1024"):
        await client.get("127.0.0.1", port, "/metrics")
    await client.close()


async def test_refused_connection_raises_connection_refused() -> None:
    with socket.socket() as sock:  # a loopback port bound, then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    with pytest.raises(ConnectionRefusedError):
        await client.get("127.0.0.1", port, "/metrics")
    await client.close()


async def test_scrapes_started_together_are_read_when_their_read_window_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The answers are there at once, but read only when the shared window closes."""
    monkeypatch.setattr(scrapeclient, "READ_DELAY", 0.3)
    answered: list[float] = []
    loop = asyncio.get_running_loop()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                writer.write(ok(b"now"))
                await writer.drain()
                answered.append(loop.time())
        writer.close()

    servers = [await asyncio.start_server(handle, "127.0.0.1", 0) for _ in range(2)]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    client = KeepAliveClient(ssl_context=None, max_body_bytes=1024)
    await asyncio.gather(*(client.get("127.0.0.1", p, "/metrics") for p in ports))  # connected
    answered.clear()
    start = loop.time()
    timer_calls: list[float] = []
    call_at = loop.call_at

    def counting_call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        timer_calls.append(when)
        return call_at(when, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    bodies = await asyncio.gather(*(client.get("127.0.0.1", p, "/metrics") for p in ports))
    done = loop.time()
    assert bodies == [b"now", b"now"]
    assert len(answered) == 2 and all(t < start + 0.3 for t in answered)
    assert done >= start + 0.3 - CLOCK_STEP
    assert len(timer_calls) == 1  # one timer: the window both share
    await client.close()
    for s in servers:
        s.close()
        await s.wait_closed()
