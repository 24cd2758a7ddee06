"""``grpc.health.v1`` with upstream's semantics (spec §10).

Without leader election every service name, known or not, answers by the readiness logic:
SERVING once discovery and the first scrape are done, every readiness-checking plugin is ready and
the server is not draining. ``liveness`` answers SERVING while the process is up, draining or not,
so a drain never gets the pod killed early. ``Watch`` is not implemented, as upstream.

With leader election only ``liveness`` (always SERVING), ``readiness``, ``""`` and the ext_proc
service name are known (readiness then also requires holding the lease, which the ``ready``
callable includes); any other name answers SERVICE_UNKNOWN.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

LIVENESS = "liveness"
READINESS = "readiness"
EXTPROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
_KNOWN = frozenset({"", LIVENESS, READINESS, EXTPROC_SERVICE})


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, ready: Callable[[], bool], *, leader_election: bool = False) -> None:
        self._ready = ready
        self._leader_election = leader_election

    def status(self, service: str) -> int:
        if service == LIVENESS:
            return _SERVING  # type: ignore[no-any-return]
        if self._leader_election and service not in _KNOWN:
            return _UNKNOWN  # type: ignore[no-any-return]
        return _SERVING if self._ready() else _NOT_SERVING  # type: ignore[no-any-return]

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthListResponse:
        names = ("", LIVENESS, READINESS, EXTPROC_SERVICE)
        return health_pb2.HealthListResponse(
            statuses={n: health_pb2.HealthCheckResponse(status=self.status(n)) for n in names}
        )

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")
