"""The ext_proc server: a minimal gRPC server on asyncio's own transports, HTTP/2 by libnghttp2
(``epp.server.h2conn``, through ``ngh2``), serving exactly the methods of the ext_proc port.

Why not grpc.aio: it spends about 100 µs of CPU per message pair on this machine whatever the
servicer does (``epp bench micro``, the empty-servicer row), and an ext_proc stream carries one
pair per request body chunk and per streamed response token. Here a message costs libnghttp2's
frame handling, one protobuf decode, the ``RequestStream`` call and one buffered write.

Methods:

- ``envoy.service.ext_proc.v3.ExternalProcessor/Process``: one ``RequestStream`` per call (all
  protocol logic is there; this module only moves messages and guarantees that every stream ends
  in a reply or a clean error, never in silence):

  * messages that cannot route (every message but the request body's end and request trailers)
    are answered inline, without a task; a message that routes runs in a task, and the messages
    that arrive meanwhile wait in order behind it;
  * an unexpected error while handling a message becomes a 500 ImmediateResponse instead of a
    dead stream;
  * protocol misuse (``epp.server.misuse.ProtocolError``, see ``epp.server.stream`` for the
    cases), including bytes that do not decode as a ``ProcessingRequest``, ends the stream with
    gRPC status ``INVALID_ARGUMENT`` and a message naming the case; it is counted
    (``llm_d_epp_extproc_protocol_errors_total{reason}``) and logged, rate-limited;
  * the client half-closing ends the stream with OK; a reset (the client cancelling, or the
    connection lost) ends it too. Either way a request that was routed is completed
    (``TerminationCause`` client-disconnect or error);
  * with flow control on, a half-close that arrives while a complete request waits for its
    routing decision abandons the request: its queue slot is freed at once
    (``EvictedContextCancelled``) and the stream ends with OK. Envoy half-closes only when it
    wants no more answers: its downstream went away, or with ``ext_proc_graceful_grpc_close`` it
    ends the stream gracefully and resets it about a second later, by which time the queue may
    have dispatched the request for a client that is gone;
  * an in-flight request that flow control evicts (``flowControl.enableEviction``) gets
    upstream's 429 ImmediateResponse (body ``request evicted by flow control``, header
    ``x-llm-d-request-dropped-reason: evicted``) at once, unless its response already ended; the
    stream ends and completion (``TerminationCause`` evicted) frees its flow-control slot;
  * with ``--enable-grpc-stream-metrics`` each stream is counted by how it ended
    (``epp.observability.streams``).

- ``epp.admin.v1.Admin/*`` (``epp.server.admin``): unary calls, answered when the client
  half-closes; the ``authorization`` header is the call's bearer token.
- with ``--health-checking``, ``grpc.health.v1.Health/Check`` and ``List`` (``Watch`` answers
  UNIMPLEMENTED).

Any other method answers UNIMPLEMENTED, and so does a compressed message (Envoy's ext_proc
client never compresses).

TLS (``--secure-serving``) is OpenSSL's through asyncio (``epp.server.tls.server_ssl_context``):
ALPN ``h2``, ``--tls-min-version`` (TLS 1.2 or 1.3), ``--tls-cipher-suites`` (TLS 1.2 suites),
``--grpc-client-ca-file`` (mTLS: a client certificate it signed is required) and
``--enable-cert-reload`` (new handshakes take the new pair; open connections keep theirs).
``epp --workers`` shares the port with ``SO_REUSEPORT``. ``stop(grace)`` sends GOAWAY, lets open
streams finish for ``grace`` seconds, then closes the connections (the calls hear a reset, which
completes their requests as client disconnects).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import Eviction
from epp.observability import streams as codes
from epp.plugin import ErrorCode, InferenceError
from epp.server import extproc_rpc, messages
from epp.server import h2wire as w
from epp.server.admin import SERVICE as ADMIN_SERVICE
from epp.server.admin import AdminError, AdminServicer
from epp.server.context import ServerContext
from epp.server.h2conn import Call, CallIO, Connection
from epp.server.health import EXTPROC_SERVICE, LIVENESS, READINESS, HealthServicer
from epp.server.misuse import UNDECODABLE, MisuseLog, ProtocolError
from epp.server.stream import Replies, RequestStream

log = logging.getLogger(__name__)

PROCESS = extproc_rpc.METHOD
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_LIST = "/grpc.health.v1.Health/List"
ADMIN_PREFIX = f"/{ADMIN_SERVICE}/"
_INTERNAL = InferenceError(ErrorCode.INTERNAL, "unexpected error in the endpoint picker")
_STATUS_NAMES = {w.GRPC_OK: codes.OK, w.GRPC_INVALID_ARGUMENT: codes.INVALID_ARGUMENT}


class ExtProcCall:
    """One ext_proc stream."""

    __slots__ = (
        "closed",
        "ctx",
        "evicting",
        "first",
        "io",
        "max_send",
        "misuse",
        "queue",
        "started",
        "stream",
        "tail",
        "task",
    )

    def __init__(
        self, io: CallIO, ctx: ServerContext, misuse: MisuseLog, *, max_send: int = 2**31 - 1
    ) -> None:
        self.io = io
        self.ctx = ctx
        self.misuse = misuse
        self.max_send = max_send
        self.stream = RequestStream(ctx)
        self.queue: collections.deque[bytes] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.first: Coroutine[Any, Any, Replies] | None = None  # the task's, until it starts
        self.evicting: asyncio.Task[None] | None = None
        self.tail = False  # the client half-closed while a task was running
        self.closed = False
        self.started = 0.0
        if ctx.streams is not None:
            ctx.streams.started()
            self.started = time.monotonic()

    def on_message(self, data: bytes) -> None:
        if self.closed:
            return
        if self.task is not None:
            self.queue.append(data)
            return
        pending = self._step(data)
        if pending is not None:
            self.first = pending
            self.task = asyncio.get_running_loop().create_task(self._run())

    def on_half_close(self) -> None:
        if self.task is not None and self.stream.abandoned_on_half_close():
            self.task.cancel()  # the client wants no answer: free its queue slot now
            self._end(w.GRPC_OK)
        elif self.task is not None:
            self.tail = True
        else:
            self._end(w.GRPC_OK)

    def on_reset(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self._close(error=False, status=codes.CANCELED)

    def _step(self, data: bytes) -> Coroutine[Any, Any, Replies] | None:
        """Handle one message; a coroutine when it has to route. A response body chunk, one per
        streamed token, skips protobuf (``messages.response_chunk``) unless it comes first."""
        try:
            stream = self.stream
            chunk = None if stream.first else messages.response_chunk(data)
            if chunk is not None:
                out: Replies | Coroutine[Any, Any, Replies] = stream.response_chunk(
                    chunk[0], chunk[1]
                )
            else:
                try:
                    msg = pb.ProcessingRequest.FromString(data)
                except DecodeError as exc:
                    reason = f"undecodable ProcessingRequest: {exc}"
                    raise ProtocolError(UNDECODABLE, reason) from None
                out = stream.dispatch(msg)
        except ProtocolError as err:
            self._protocol_error(err)
            return None
        except Exception:
            log.exception("ext_proc stream failed while handling a message")
            self._fail()
            return None
        if isinstance(out, list):
            self._reply(out)
            return None
        return out

    async def _run(self) -> None:
        pending, self.first = self.first, None
        try:
            while pending is not None:
                try:
                    replies = await pending
                except ProtocolError as err:
                    self._protocol_error(err)
                    return
                except Exception:
                    log.exception("ext_proc stream failed while routing")
                    self._fail()
                    return
                self._reply(replies)
                self._watch_eviction()
                pending = None
                while pending is None and self.queue and not self.closed:
                    pending = self._step(self.queue.popleft())
            if self.tail:
                self._end(w.GRPC_OK)
        finally:
            self.task = None

    def _watch_eviction(self) -> None:
        """Once routed, a request flow control may evict is watched until its stream ends."""
        if self.evicting is None and not self.closed:
            signal = self.stream.eviction
            if signal is not None:
                self.evicting = asyncio.get_running_loop().create_task(self._evict(signal))

    async def _evict(self, signal: Eviction) -> None:
        err = await signal.wait()
        self.evicting = None
        if self.closed or self.stream.eviction is None:  # its response ended meanwhile
            return
        self.io.send(self.stream.evict(err).SerializeToString())
        self._end(w.GRPC_OK)

    def _reply(self, replies: Replies) -> None:
        for reply in replies:
            # ``messages.encode`` inlined: most replies (every streamed chunk's) are bytes already
            data = reply if type(reply) is bytes else messages.encode(reply)
            if len(data) > self.max_send:  # as gRPC does: the call fails, nothing is cut
                log.error("ext_proc reply of %d bytes over --grpc-max-send-msg-size", len(data))
                self._end(w.GRPC_RESOURCE_EXHAUSTED, "reply over the send limit", error=True)
                return
            self.io.send(data)
        if self.stream.done:
            self._end(w.GRPC_OK)

    def _fail(self) -> None:
        self.io.send(messages.immediate(_INTERNAL).SerializeToString())
        self._end(w.GRPC_OK, error=True)

    def _protocol_error(self, err: ProtocolError) -> None:
        self.ctx.director.protocol_error(err.reason)
        self.misuse(err)
        self._end(w.GRPC_INVALID_ARGUMENT, err.message, error=True)

    def _end(self, code: int, message: str = "", *, error: bool = False) -> None:
        if not self.closed:
            self.io.finish(code, message)
            self._close(error=error, status=_STATUS_NAMES.get(code, codes.INTERNAL))

    def _close(self, *, error: bool, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.queue.clear()
        if self.first is not None:  # a task cancelled before it started: its routing never ran
            self.first.close()
            self.first = None
        if self.evicting is not None:
            self.evicting.cancel()
            self.evicting = None
        self.stream.close(error=error)
        if self.ctx.streams is not None:
            self.ctx.streams.finished(status, time.monotonic() - self.started)


class HealthCall:
    """``Check`` or ``List``: one request message, one answer at the client's half-close."""

    __slots__ = ("health", "io", "listing", "request")

    def __init__(self, io: CallIO, health: HealthServicer, *, listing: bool) -> None:
        self.io = io
        self.health = health
        self.listing = listing
        self.request = b""

    def on_message(self, data: bytes) -> None:
        self.request = data

    def on_half_close(self) -> None:
        try:
            if self.listing:
                names = ("", LIVENESS, READINESS, EXTPROC_SERVICE)
                statuses = {
                    n: health_pb2.HealthCheckResponse(status=self.health.status(n)) for n in names
                }
                reply = health_pb2.HealthListResponse(statuses=statuses).SerializeToString()
            else:
                service = health_pb2.HealthCheckRequest.FromString(self.request).service
                status = self.health.status(service)
                reply = health_pb2.HealthCheckResponse(status=status).SerializeToString()
        except DecodeError:
            self.io.finish(w.GRPC_INTERNAL, "undecodable health request")
            return
        self.io.send(reply)
        self.io.finish(w.GRPC_OK)

    def on_reset(self) -> None:
        pass


UnaryHandler = Callable[[bytes, str], Awaitable[bytes]]
"""A unary method: (request message, ``authorization`` header) → the response message."""


class UnaryCall:
    """A unary call answered by an async handler once the client half-closes (the admin API).
    A second request message is a protocol error of the client: INVALID_ARGUMENT."""

    __slots__ = ("count", "handler", "io", "request", "task")

    def __init__(self, io: CallIO, handler: UnaryHandler) -> None:
        self.io = io
        self.handler = handler
        self.request = b""
        self.count = 0
        self.task: asyncio.Task[None] | None = None

    def on_message(self, data: bytes) -> None:
        self.request = data
        self.count += 1

    def on_half_close(self) -> None:
        if self.count != 1:
            self.io.finish(w.GRPC_INVALID_ARGUMENT, f"{self.count} request messages, expected 1")
            return
        self.task = asyncio.get_running_loop().create_task(self._answer())

    async def _answer(self) -> None:
        auth = next((str(v, "latin-1") for k, v in self.io.headers if k == b"authorization"), "")
        try:
            reply = await self.handler(self.request, auth)
        except AdminError as err:
            self.io.finish(err.code, err.message)
            return
        except DecodeError:
            self.io.finish(w.GRPC_INVALID_ARGUMENT, "undecodable request message")
            return
        except Exception:
            log.exception("admin call failed")
            self.io.finish(w.GRPC_INTERNAL, "unexpected error in the endpoint picker")
            return
        self.io.send(reply)
        self.io.finish(w.GRPC_OK)

    def on_reset(self) -> None:
        if self.task is not None:
            self.task.cancel()


class H2Server:
    """The listening socket and its connections."""

    def __init__(
        self,
        ctx: ServerContext,
        health: HealthServicer | None,
        *,
        max_message: int,
        max_send: int = 2**31 - 1,
        admin: AdminServicer | None = None,
    ) -> None:
        self._ctx = ctx
        self._health = health
        self._admin = admin
        self._max_message = max_message
        self._max_send = max_send
        self._misuse = MisuseLog(log, time.monotonic)
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._idle = asyncio.Event()

    def _route(self, path: str, io: CallIO) -> Call | None:
        if path == PROCESS:
            return ExtProcCall(io, self._ctx, self._misuse, max_send=self._max_send)
        if self._health is not None and path in (HEALTH_CHECK, HEALTH_LIST):
            return HealthCall(io, self._health, listing=path == HEALTH_LIST)
        if self._admin is not None and path.startswith(ADMIN_PREFIX):
            handler = self._admin.method(path[len(ADMIN_PREFIX) :])
            if handler is not None:
                return UnaryCall(io, handler)
        return None

    def _connection(self) -> Connection:
        conn = Connection(self._route, self._max_message, self._closed)
        self._conns.add(conn)
        self._idle.clear()
        return conn

    def _closed(self, conn: Connection) -> None:
        self._conns.discard(conn)
        if not self._conns:
            self._idle.set()

    async def start(
        self, host: str, port: int, *, tls: ssl.SSLContext | None, reuse_port: bool
    ) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._connection, host, port, ssl=tls, reuse_port=reuse_port or None, backlog=1024
        )
        # uvloop's Server.sockets is a list where typeshed says tuple: read it untyped, so a
        # compiled build (mypyc checks declared types) takes either
        server: Any = self._server
        return int(server.sockets[0].getsockname()[1])

    async def stop(self, grace: float | None) -> None:
        """GOAWAY to every connection; the clients close them once their streams have ended (a
        client that reads its last trailers and an EOF together may fail that stream, so the
        server does not close first); after ``grace`` seconds (none: at once) the server closes
        what is left."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns):
            conn.goaway()
        if self._conns and grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for conn in list(self._conns):
            conn.close()
