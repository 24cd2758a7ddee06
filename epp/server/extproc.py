"""The ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer: a thin dispatch loop.

All protocol logic lives in ``RequestStream``; this loop only moves messages and guarantees that
an unexpected error becomes a 500 ImmediateResponse instead of a dead stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.plugin import ErrorCode, InferenceError
from epp.server import messages
from epp.server.context import ServerContext
from epp.server.stream import RequestStream

log = logging.getLogger(__name__)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx

    async def Process(
        self,
        request_iterator: AsyncIterator[pb.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = RequestStream(self._ctx)
        error = False
        try:
            async for msg in request_iterator:
                try:
                    replies = await stream.on_message(msg)
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
        finally:
            stream.close(error=error)
