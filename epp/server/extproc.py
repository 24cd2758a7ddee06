"""The ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer: a thin dispatch loop.

All protocol logic lives in ``RequestStream``; this loop only moves messages and guarantees that
every stream ends in a reply or a clean error, never in silence:

* an unexpected error while handling a message becomes a 500 ImmediateResponse instead of a dead
  stream;
* protocol misuse (``epp.server.misuse.ProtocolError``, see ``epp.server.stream`` for the cases),
  including bytes that do not decode as a ``ProcessingRequest``, ends the stream with gRPC status
  ``INVALID_ARGUMENT`` and a message naming the case; it is counted
  (``llm_d_epp_extproc_protocol_errors_total{reason}``) and logged, rate-limited;
* the client half-closing ends the stream with OK; the client cancelling ends it too. Either way
  a request that was routed is completed (``TerminationCause`` client-disconnect or error);
* with flow control on, a half-close that arrives while a complete request waits for its routing
  decision abandons the request: its queue slot is freed at once (``EvictedContextCancelled``)
  and the stream ends with OK. Envoy half-closes only when it wants no more answers: its
  downstream went away, or with ``ext_proc_graceful_grpc_close`` it ends the stream gracefully
  and resets it about a second later, by which time the queue may have dispatched the request
  for a client that is gone;
* an in-flight request that flow control evicts (``flowControl.enableEviction``) gets upstream's
  429 ImmediateResponse (body ``request evicted by flow control``, header
  ``x-llm-d-request-dropped-reason: evicted``) at once, unless its response already ended; the
  stream ends and completion (``TerminationCause`` evicted) frees its flow-control slot.

With ``--enable-grpc-stream-metrics`` each stream is counted by how it ended
(``epp.observability.streams``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.flowcontrol.eviction import Eviction
from epp.observability import streams as codes
from epp.plugin import ErrorCode, InferenceError
from epp.server import messages
from epp.server.context import ServerContext
from epp.server.misuse import UNDECODABLE, MisuseLog, ProtocolError
from epp.server.stream import Replies, RequestStream

log = logging.getLogger(__name__)


class ExtProcServicer:
    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx
        self._misuse_log = MisuseLog(log, time.monotonic)

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[messages.Reply]:
        metrics = self._ctx.streams
        if metrics is None:
            async for reply in self._process(request_iterator, context):
                yield reply
            return
        metrics.started()
        start, code = time.monotonic(), codes.CANCELED  # closed early: the client went away
        try:
            async for reply in self._process(request_iterator, context):
                yield reply
            code = codes.INVALID_ARGUMENT if context.code() else codes.OK
        except Exception:
            code = codes.INTERNAL
            raise
        finally:
            metrics.finished(code, time.monotonic() - start)

    async def _process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[messages.Reply]:
        stream = RequestStream(self._ctx)
        error = False
        incoming = _Incoming(_decoded(request_iterator))
        try:
            while (msg := await incoming.next(stream.eviction)) is not None:
                if isinstance(msg, InferenceError):  # flow control evicted the request
                    yield stream.evict(msg)
                    return
                try:
                    replies = await _answer(stream, incoming, msg)
                    if replies is None:  # abandoned: the client half-closed while it waited
                        return
                except ProtocolError:
                    raise
                except Exception:
                    error = True
                    log.exception(
                        "ext_proc stream failed", extra={"request_kind": msg.WhichOneof("request")}
                    )
                    yield messages.immediate(
                        InferenceError(
                            ErrorCode.INTERNAL, "unexpected error in the endpoint picker"
                        )
                    )
                    return
                for reply in replies:
                    yield reply
                if stream.done:
                    return
        except ProtocolError as err:
            error = True
            self._ctx.director.protocol_error(err.reason)
            self._misuse_log(err)
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(err.message)
        finally:
            incoming.close()
            stream.close(error=error)


class _Incoming:
    """The stream's next message; once the request can be evicted, raced against its eviction
    (a pending read is kept across calls, so no message is lost). Requests that cannot be
    evicted read the stream directly."""

    def __init__(self, messages: AsyncIterator[pb.ProcessingRequest]) -> None:
        self._messages = messages
        self._read: asyncio.Task[pb.ProcessingRequest | None] | None = None
        self._evicted: asyncio.Task[InferenceError] | None = None

    async def next(self, eviction: Eviction | None) -> pb.ProcessingRequest | InferenceError | None:
        if eviction is None and self._read is None:
            return await anext(self._messages, None)
        if eviction is not None and self._evicted is None:
            self._evicted = asyncio.ensure_future(eviction.wait())
        if self._read is None:
            self._read = asyncio.ensure_future(anext(self._messages, None))
        waiting = (
            [self._read]
            if eviction is None or self._evicted is None
            else [self._read, self._evicted]
        )
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if self._read.done():
            read, self._read = self._read, None
            return read.result()
        assert self._evicted is not None
        return self._evicted.result()

    async def route(
        self, routing: Coroutine[Any, Any, Replies], stream: RequestStream
    ) -> Replies | None:
        """Await ``routing`` while reading ahead; ``None`` when the client half-closes and the
        stream says that abandons the request (the routing task is cancelled)."""
        task = asyncio.ensure_future(routing)
        if self._read is None:
            self._read = asyncio.ensure_future(anext(self._messages, None))
        try:
            if not self._read.done():
                await asyncio.wait([task, self._read], return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and _ended(self._read) and stream.abandoned_on_half_close():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return None
            # a message read ahead waits for the next step; after a half-close that does not
            # abandon, the answer still goes out and the loop then sees the end
            return await task
        except asyncio.CancelledError:
            task.cancel()  # the stream was cancelled: so is its routing (and its queue wait)
            raise

    def close(self) -> None:
        for task in (self._read, self._evicted):
            if task is not None:
                task.cancel()


async def _answer(
    stream: RequestStream, incoming: _Incoming, msg: pb.ProcessingRequest
) -> Replies | None:
    out = stream.dispatch(msg)
    if isinstance(out, list):
        return out
    if not stream.director.flow_controlled:  # routing cannot wait: no need to read ahead
        return await out
    return await incoming.route(out, stream)


def _ended(read: asyncio.Task[pb.ProcessingRequest | None]) -> bool:
    """The read-ahead saw the client's half-close (a failed read is raised by the next read)."""
    return (
        read.done() and not read.cancelled() and read.exception() is None and read.result() is None
    )


def add_to_server(servicer: ExtProcServicer, server: grpc.aio.Server) -> None:
    """Register ``Process`` with a serializer that passes already-serialized replies on."""
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.Process,
        request_deserializer=pb.ProcessingRequest.FromString,
        response_serializer=messages.encode,
    )
    service = "envoy.service.ext_proc.v3.ExternalProcessor"
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service, {"Process": handler}),)
    )


async def _decoded(
    requests: AsyncIterator[pb.ProcessingRequest],
) -> AsyncIterator[pb.ProcessingRequest]:
    """The stream's messages; bytes that do not decode end it as protocol misuse."""
    try:
        async for msg in requests:
            yield msg
    except DecodeError as exc:
        raise ProtocolError(UNDECODABLE, f"undecodable ProcessingRequest: {exc}") from None
