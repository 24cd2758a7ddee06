"""What one HTTP/2 connection of the ext_proc server allows its peer, and why: the engine's
settings and limits, the client-ping policy and the server's keepalive (``epp.server.h2conn``).

libnghttp2 (``ngh2``) enforces, besides every rule of RFC 9113 it answers with RST_STREAM or
GOAWAY, its own limits: at most 8 CONTINUATION frames after a HEADERS, 1,000 queued SETTINGS and
PING acknowledgements, 32 entries in one SETTINGS frame, and a budget of protocol "glitches"
(10,000, then 330 a second). Here:

* ``MAX_CONCURRENT_STREAMS`` = 1000 per connection, advertised in SETTINGS; a stream over it is
  refused (REFUSED_STREAM before the client acknowledged the setting, a PROTOCOL_ERROR GOAWAY
  after). grpc-go, and so llm-d's Go EPP (``grpc.NewServer()`` without
  ``MaxConcurrentStreams``), advertises no limit at all. Envoy multiplexes every ext_proc stream
  of a worker over one connection and opens another when the server's limit is reached; its
  default circuit breaker allows 1024 requests in flight to a cluster, so a default Envoy
  rarely needs a second connection, while one connection's streams, each a few KB of request
  state, stay bounded.
* Messages: ``--grpc-max-recv-msg-size`` per message, checked from its 5-byte prefix before the
  message is buffered. The windows are the largest HTTP/2 allows and are refilled as data
  arrives (Envoy's large bodies flow without waiting for WINDOW_UPDATEs), so a connection
  buffers at most one partial message per stream.
* Header lists: ``MAX_HEADER_LIST`` = 64 KiB decoded (``SETTINGS_MAX_HEADER_LIST_SIZE``); over
  it the connection ends with GOAWAY. ext_proc carries the HTTP request's headers inside its
  messages; the HTTP/2 headers of a call are a handful of short fields.
* Stream resets by the client (CVE-2023-44487, "rapid reset"): a burst of ``RESET_BURST`` =
  1000, then ``RESET_RATE`` = 200 a second, over which the connection gets a GOAWAY (libnghttp2's
  default rate is 33 a second). Envoy resets an ext_proc stream when its downstream request is
  aborted, so under overload legitimate resets come at the request rate; a connection over the
  limit refuses new streams, which Envoy opens on a new connection, while its open ones finish.
* Writes: while the transport holds more than ``WRITE_HIGH_WATER`` (1 MiB) unsent bytes (a
  client that does not read), the connection stops reading, so it takes no frame that would
  make more to send, until the buffer is under ``WRITE_LOW_WATER`` (256 KiB).
* Keepalive: after ``KEEPALIVE_TIME`` (60 s) with nothing read, the server sends a PING; with
  still nothing read ``KEEPALIVE_TIMEOUT`` (20 s, grpc-go's default) later it closes the
  connection, whose calls hear a reset. grpc-go's server pings after 2 hours; an EPP's peers
  are a few Envoys on a cluster network, where a minute finds a vanished peer (and frees its
  streams) sooner, for one PING a minute on an idle connection. A client that stops reading
  is closed the same way, since the server stops reading it too.
* Client PINGs, as grpc-go enforces them (``keepalive.EnforcementPolicy``): a PING that comes
  less than ``MIN_PING_INTERVAL`` (10 s; grpc-go's default 5 min) after the previous one is a
  strike unless the server sent headers or data in between, and the strike after
  ``MAX_PING_STRIKES`` (2) ends the connection with GOAWAY ENHANCE_YOUR_CALM "too_many_pings".
  Unlike grpc-go's default, PINGs on a connection without streams are allowed at that
  interval: Envoy's ``connection_keepalive`` pings idle connections.

llm-d has no flag for any of these; they are module constants.
"""

from __future__ import annotations

import ngh2

from epp.server import h2wire as w

MAX_CONCURRENT_STREAMS = 1000
MAX_HEADER_LIST = 64 << 10
RESET_BURST = 1000
RESET_RATE = 200
WRITE_HIGH_WATER = 1 << 20
WRITE_LOW_WATER = 256 << 10
KEEPALIVE_TIME = 60.0
KEEPALIVE_TIMEOUT = 20.0
CLOSE_LINGER = 1.0
MIN_PING_INTERVAL = 10.0
MAX_PING_STRIKES = 2

SETTINGS = {
    ngh2.Setting.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
    ngh2.Setting.INITIAL_WINDOW_SIZE: w.MAX_WINDOW,
    ngh2.Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
    ngh2.Setting.ENABLE_PUSH: 0,
}
"""What the server announces in its first SETTINGS frame."""

CONFIG = ngh2.Configuration(
    max_inbound_header_list_size=MAX_HEADER_LIST,
    stream_reset_rate_limit=(RESET_BURST, RESET_RATE),
)


class PingPolicy:
    """The client-ping rule of the module docstring, for one connection."""

    __slots__ = ("_last", "_strikes", "sent")

    def __init__(self) -> None:
        self._last = float("-inf")
        self._strikes = 0
        self.sent = False  # the server sent headers or data since the last PING

    def too_many(self, now: float) -> bool:
        """A PING arrived at ``now``: whether the connection should end."""
        if self.sent:
            self.sent = False
            self._strikes = 0
        elif now - self._last < MIN_PING_INTERVAL:
            self._strikes += 1
        self._last = now
        return self._strikes > MAX_PING_STRIKES


class Keepalive:
    """The server's keepalive of the module docstring, for one connection: ``due`` says, at
    each check, what to do and when to check again."""

    __slots__ = ("_ping_sent", "last_read")

    PING, CLOSE, WAIT = "ping", "close", "wait"

    def __init__(self, now: float) -> None:
        self.last_read = now
        self._ping_sent: float | None = None  # a PING awaits any sign of life

    def due(self, now: float) -> tuple[str, float]:
        """The action now and the delay to the next check."""
        sent = self._ping_sent
        if sent is not None and self.last_read <= sent:
            if now - sent >= KEEPALIVE_TIMEOUT:
                return self.CLOSE, 0.0
            return self.WAIT, sent + KEEPALIVE_TIMEOUT - now
        if now - self.last_read >= KEEPALIVE_TIME:
            self._ping_sent = now
            return self.PING, KEEPALIVE_TIMEOUT
        self._ping_sent = None
        return self.WAIT, self.last_read + KEEPALIVE_TIME - now
