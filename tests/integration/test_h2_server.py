"""The ext_proc port, served by ``epp.server.h2``, through real gRPC clients: health on the
ext_proc port, TLS, unknown methods, a client's cancel, and stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.server.extproc_rpc import process
from epp.server.tls import self_signed
from tests.conftest import body_msg, exchange, headers_msg, set_headers_of

pytestmark = pytest.mark.both_loops  # uvloop and asyncio (conftest.py)

CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
H = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "rid-1"}
DEAD = [1, 2, 3]
SERVING = health_pb2.HealthCheckResponse.SERVING


def running(app) -> float:
    families = app.metrics.registry.collect()
    return sum(
        s.value for f in families if f.name == "llm_d_epp_request_running" for s in f.samples
    )


async def test_the_server_routes_a_request(start_app) -> None:
    app = await start_app(DEAD)
    replies = await exchange(app, [headers_msg(H), body_msg(CHAT)])
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    assert set_headers_of(replies[0])["x-gateway-destination-endpoint"].startswith("127.0.0.1:")


async def test_health_is_served_on_the_ext_proc_port_when_health_checking(start_app) -> None:
    app = await start_app(DEAD, health_checking=True)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        check = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5)
        assert check.status == SERVING
        listing = await stub.List(health_pb2.HealthListRequest(), timeout=5)
        assert listing.statuses["liveness"].status == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Watch(health_pb2.HealthCheckRequest(), timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_health_is_not_on_the_ext_proc_port_without_health_checking(
    start_app,
) -> None:
    app = await start_app(DEAD)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_tls_with_the_certificate_of_cert_path(start_app, tmp_path: Path) -> None:
    cert, key = self_signed()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    app = await start_app(DEAD, secure_serving=True, cert_path=str(tmp_path))
    creds = grpc.ssl_channel_credentials(root_certificates=cert)
    options = [("grpc.ssl_target_name_override", "epp")]
    target = f"127.0.0.1:{app.grpc_port}"
    async with grpc.aio.secure_channel(target, creds, options=options) as ch:
        replies = [r async for r in process(ch)(iter([headers_msg(H), body_msg(CHAT)]))]
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]


async def test_a_cancelled_stream_completes_its_request(start_app) -> None:
    app = await start_app(DEAD)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = process(ch)()
        await call.write(headers_msg(H))
        await call.write(body_msg(CHAT))
        await call.read()
        await call.read()
        assert running(app) == 1
        call.cancel()
        async with asyncio.timeout(5):
            while running(app):
                await asyncio.sleep(0.01)


async def test_stop_lets_an_open_stream_finish_and_refuses_new_ones(start_app) -> None:
    app = await start_app(DEAD)
    target = f"127.0.0.1:{app.grpc_port}"
    async with grpc.aio.insecure_channel(target) as ch:
        call = process(ch)()
        await call.write(headers_msg(H))
        await call.write(body_msg(CHAT))
        await call.read()
        app.stop()
        await call.read()
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    with pytest.raises(grpc.aio.AioRpcError):
        await exchange(app, [headers_msg(H), body_msg(CHAT)], timeout=2)
