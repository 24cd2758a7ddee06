"""Envoy's ext_proc method, bound with grpc's generic API: its name, a client call, a handler.

Envoy calls ``/envoy.service.ext_proc.v3.ExternalProcessor/Process``, one bidirectional stream of
``ProcessingRequest`` → ``ProcessingResponse`` per HTTP exchange. The messages are the project's
own schema of Envoy's wire format (``proto/epp/extproc/v3/extproc.proto``, generated into
``epp._proto.epp_extproc_v3_pb2``); the method name is Envoy's, since Envoy calls it by that name.
No stubs are generated: a client or server binds the method here.

    async with grpc.aio.insecure_channel(target) as ch:
        replies = [r async for r in process(ch)(iter(messages))]   # or call = process(ch)()

    server.add_generic_rpc_handlers((handler(servicer_function),))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import grpc

from epp._proto import epp_extproc_v3_pb2 as pb
from epp.server import messages

SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
METHOD: Final = f"/{SERVICE}/Process"


def process(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """The ``Process`` stream-stream callable on ``channel`` (sync or asyncio)."""
    return channel.stream_stream(
        METHOD,
        request_serializer=pb.ProcessingRequest.SerializeToString,
        response_deserializer=pb.ProcessingResponse.FromString,
    )


def handler(behaviour: Callable[..., Any]) -> grpc.GenericRpcHandler:
    """``behaviour(requests, context)``, yielding replies (messages or already-serialized bytes),
    as the ``Process`` method of a ``grpc.server`` or ``grpc.aio.server``."""
    method = grpc.stream_stream_rpc_method_handler(
        behaviour,
        request_deserializer=pb.ProcessingRequest.FromString,
        response_serializer=messages.encode,
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})
