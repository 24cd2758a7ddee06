"""The ext_proc server on asyncio's own transports (``--ext-proc-server h2``; grpc.aio is the
default): a minimal HTTP/2 + gRPC server for exactly the methods the ext_proc port serves.

Why: grpc.aio spends about 100 µs of CPU per message pair on this machine, whatever the
servicer does (``epp bench micro``, the empty-servicer row), and an ext_proc stream carries one
pair per request body chunk and per streamed response token. Here a message costs the frame
parse, one protobuf decode, the ``RequestStream`` call and one buffered write.

Methods: ``envoy.service.ext_proc.v3.ExternalProcessor/Process`` (``RequestStream``, driven as
``epp.server.extproc`` drives it under grpc.aio, with the same error semantics), and with
``--health-checking`` ``grpc.health.v1.Health/Check`` and ``List`` (``Watch`` answers
UNIMPLEMENTED, as the grpc.aio servicer does). Any other method answers UNIMPLEMENTED.

Messages that cannot route (every message but the request body's end and request trailers) are
answered inline, without a task; a message that routes runs in a task, and the messages that
arrive meanwhile wait in order behind it. TLS (``--secure-serving``) is asyncio's, offering ALPN
``h2``; ``epp --workers`` shares the port with ``SO_REUSEPORT``. ``stop(grace)`` sends GOAWAY,
lets open streams finish for ``grace`` seconds, then closes the connections (the calls hear a
reset, which completes their requests as client disconnects).

Not the default yet, for want of features, not of speed: it refuses ``--enable-cert-reload``,
``--grpc-client-ca-file``, ``--tls-*`` and ``--enable-grpc-stream-metrics`` (``Settings``), and
serves neither the admin API nor flow control's eviction replies. Under load its time to first
token is on par with grpc.aio's or lower when both are measured at the same time (``epp bench
together``, README "Per-request cost"); the 10-20x gap once seen came from targets measured one
after another on a machine whose load changed between them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.plugin import ErrorCode, InferenceError
from epp.server import h2wire as w
from epp.server import messages
from epp.server.context import ServerContext
from epp.server.h2conn import Call, CallIO, Connection
from epp.server.health import EXTPROC_SERVICE, LIVENESS, READINESS, HealthServicer
from epp.server.misuse import UNDECODABLE, MisuseLog, ProtocolError
from epp.server.stream import Replies, RequestStream
from epp.server.tls import self_signed

log = logging.getLogger(__name__)

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_LIST = "/grpc.health.v1.Health/List"
_INTERNAL = InferenceError(ErrorCode.INTERNAL, "unexpected error in the endpoint picker")


class ExtProcCall:
    """One ext_proc stream."""

    __slots__ = ("closed", "ctx", "io", "misuse", "queue", "stream", "tail", "task")

    def __init__(self, io: CallIO, ctx: ServerContext, misuse: MisuseLog) -> None:
        self.io = io
        self.ctx = ctx
        self.misuse = misuse
        self.stream = RequestStream(ctx)
        self.queue: collections.deque[bytes] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        self.tail = False  # the client half-closed while a task was running
        self.closed = False

    def on_message(self, data: bytes) -> None:
        if self.closed:
            return
        if self.task is not None:
            self.queue.append(data)
            return
        pending = self._step(data)
        if pending is not None:
            self.task = asyncio.get_running_loop().create_task(self._run(pending))

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
        self._close(error=False)

    def _step(self, data: bytes) -> Coroutine[Any, Any, Replies] | None:
        """Handle one message; a coroutine when it has to route."""
        try:
            try:
                msg = pb.ProcessingRequest.FromString(data)
            except DecodeError as exc:
                raise ProtocolError(UNDECODABLE, f"undecodable ProcessingRequest: {exc}") from None
            out = self.stream.dispatch(msg)
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

    async def _run(self, first: Coroutine[Any, Any, Replies]) -> None:
        pending: Coroutine[Any, Any, Replies] | None = first
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
                pending = None
                while pending is None and self.queue and not self.closed:
                    pending = self._step(self.queue.popleft())
            if self.tail:
                self._end(w.GRPC_OK)
        finally:
            self.task = None

    def _reply(self, replies: Replies) -> None:
        for reply in replies:
            self.io.send(messages.encode(reply))
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
            self._close(error=error)

    def _close(self, *, error: bool) -> None:
        if not self.closed:
            self.closed = True
            self.queue.clear()
            self.stream.close(error=error)


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


class H2Server:
    """The listening socket and its connections."""

    def __init__(
        self, ctx: ServerContext, health: HealthServicer | None, *, max_message: int
    ) -> None:
        self._ctx = ctx
        self._health = health
        self._max_message = max_message
        self._misuse = MisuseLog(log, time.monotonic)
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._idle = asyncio.Event()

    def _route(self, path: str, io: CallIO) -> Call | None:
        if path == PROCESS:
            return ExtProcCall(io, self._ctx, self._misuse)
        if self._health is not None and path in (HEALTH_CHECK, HEALTH_LIST):
            return HealthCall(io, self._health, listing=path == HEALTH_LIST)
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
        return int(self._server.sockets[0].getsockname()[1])

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


def tls_context(cert_path: str) -> ssl.SSLContext:
    """``--cert-path`` (tls.crt, tls.key) or a self-signed certificate; ALPN ``h2``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["h2"])
    if cert_path:
        base = Path(cert_path)
        ctx.load_cert_chain(base / "tls.crt", base / "tls.key")
        return ctx
    import tempfile

    cert, key = self_signed()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tls.crt").write_bytes(cert)
        (Path(tmp) / "tls.key").write_bytes(key)
        ctx.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")
    return ctx
