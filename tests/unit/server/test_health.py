"""``grpc.health.v1`` answers (``epp.server.health``): liveness always, readiness by the App's
logic, unknown names only under leader election, ``Watch`` refused."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from epp.server.health import HealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
EXTPROC = "envoy.service.ext_proc.v3.ExternalProcessor"


class _Aborted(Exception):
    pass


class _Context:
    def __init__(self) -> None:
        self.aborted: tuple[Any, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise _Aborted


class _Ready:
    def __init__(self) -> None:
        self.value = False

    def __call__(self) -> bool:
        return self.value


async def _check(servicer: HealthServicer, service: str) -> int:
    req = health_pb2.HealthCheckRequest(service=service)
    resp = await servicer.Check(req, _Context())  # type: ignore[arg-type]
    return int(resp.status)


@pytest.mark.parametrize("leader_election", [False, True])
async def test_liveness_serves_while_not_ready(leader_election: bool) -> None:
    h = HealthServicer(_Ready(), leader_election=leader_election)
    assert await _check(h, "liveness") == SERVING


async def test_without_leader_election_every_name_follows_readiness() -> None:
    ready = _Ready()
    h = HealthServicer(ready)
    names = ["", "readiness", EXTPROC, "some.other.Service"]
    assert [await _check(h, n) for n in names] == [NOT_SERVING] * 4
    ready.value = True
    assert [await _check(h, n) for n in names] == [SERVING] * 4


async def test_with_leader_election_only_known_names_answer() -> None:
    ready = _Ready()
    h = HealthServicer(ready, leader_election=True)
    assert await _check(h, "some.other.Service") == UNKNOWN
    assert [await _check(h, n) for n in ("", "readiness", EXTPROC)] == [NOT_SERVING] * 3
    ready.value = True
    assert await _check(h, "some.other.Service") == UNKNOWN
    assert [await _check(h, n) for n in ("", "readiness", EXTPROC)] == [SERVING] * 3


async def test_list_names_the_four_services() -> None:
    ready = _Ready()
    h = HealthServicer(ready, leader_election=True)
    resp = await h.List(health_pb2.HealthListRequest(), _Context())  # type: ignore[arg-type]
    got = {name: s.status for name, s in resp.statuses.items()}
    assert got == {
        "": NOT_SERVING,
        "liveness": SERVING,
        "readiness": NOT_SERVING,
        EXTPROC: NOT_SERVING,
    }


async def test_watch_is_unimplemented() -> None:
    ctx = _Context()
    h = HealthServicer(_Ready())
    with pytest.raises(_Aborted):
        await h.Watch(health_pb2.HealthCheckRequest(service=""), ctx)  # type: ignore[arg-type]
    assert ctx.aborted == (grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")
