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
  a request that was routed is completed (``TerminationCause`` client-disconnect or error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf.message import DecodeError

from epp.plugin import ErrorCode, InferenceError
from epp.server import messages
from epp.server.context import ServerContext
from epp.server.misuse import UNDECODABLE, MisuseLog, ProtocolError
from epp.server.stream import RequestStream

log = logging.getLogger(__name__)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx
        self._misuse_log = MisuseLog(log, time.monotonic)

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[messages.Reply]:
        stream = RequestStream(self._ctx)
        error = False
        try:
            async for msg in _decoded(request_iterator):
                try:
                    replies = await stream.on_message(msg)
                except ProtocolError:
                    raise
                except Exception:
                    error = True
                    log.exception(
                        "ext_proc stream failed while handling %s", msg.WhichOneof("request")
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
            stream.close(error=error)


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
