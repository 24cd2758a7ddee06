"""The ext_proc stream driven directly over real gRPC (no Envoy): message-level contract."""

from __future__ import annotations

import asyncio
import json
import threading

import aiohttp
import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp._proto import epp_extproc_v3_pb2 as pb
from tests.conftest import (
    body_msg,
    dead_ports,
    exchange,
    headers_msg,
    registry_with_test_plugins,
    set_headers_of,
)

pytestmark = pytest.mark.both_loops  # uvloop and asyncio (conftest.py)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
H = {":path": "/v1/chat/completions", ":method": "POST", "x-request-id": "rid-1"}
# endpoints on loopback ports this process holds closed: scrapes fail fast, routing still works
DEAD = dead_ports(3)
P1, P2, P3 = (f"127.0.0.1:{p}" for p in DEAD)


def with_ports(body: str) -> str:
    """A config body whose ``PORT2``/``PORT3`` name the second and third dead port."""
    return body.replace("PORT2", str(DEAD[1])).replace("PORT3", str(DEAD[2]))


def lb(reply: pb.ProcessingResponse) -> dict[str, object]:
    return dict(reply.dynamic_metadata.fields["envoy.lb"].struct_value)


async def test_complete_request_gets_headers_then_body_reply(start_app) -> None:
    app = await start_app(DEAD)
    body = json.dumps(CHAT).encode()
    replies = await exchange(
        app, [headers_msg(H), body_msg(body[:10], end_of_stream=False), body_msg(body[10:])]
    )
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    hdrs = set_headers_of(replies[0])
    dest = hdrs["x-gateway-destination-endpoint"]
    assert dest in {f"127.0.0.1:{p}" for p in DEAD}
    assert lb(replies[0]) == {"x-gateway-destination-endpoint": dest}
    assert hdrs["content-length"] == str(len(body))
    assert "x-request-id" not in hdrs  # the client's id is kept, not re-set
    assert replies[0].request_headers.response.clear_route_cache
    removed = set(replies[0].request_headers.response.header_mutation.remove_headers)
    assert "x-prefiller-host-port" in removed and "x-llm-d-request-dropped-reason" in removed
    sb = replies[1].request_body.response.body_mutation.streamed_response
    assert sb.body == body and sb.end_of_stream


async def test_large_body_is_sent_back_in_62000_byte_pieces(start_app) -> None:
    app = await start_app(DEAD)
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 200_000}]}).encode()
    replies = await exchange(app, [headers_msg(H), body_msg(body)])
    pieces = [r.request_body.response.body_mutation.streamed_response for r in replies[1:]]
    assert [len(p.body) for p in pieces[:-1]] == [62_000] * (len(pieces) - 1)
    assert b"".join(p.body for p in pieces) == body
    assert [p.end_of_stream for p in pieces] == [False] * (len(pieces) - 1) + [True]


async def test_missing_request_id_is_generated_and_forwarded(start_app) -> None:
    app = await start_app(DEAD)
    replies = await exchange(
        app, [headers_msg({":path": "/v1/chat/completions"}), body_msg(json.dumps(CHAT).encode())]
    )
    assert len(set_headers_of(replies[0])["x-request-id"]) == 36


async def test_header_only_request_goes_to_a_random_endpoint(start_app) -> None:
    app = await start_app(DEAD)
    seen = set()
    for _ in range(30):
        (reply,) = await exchange(
            app, [headers_msg({":path": "/v1/models", ":method": "GET"}, end_of_stream=True)]
        )
        seen.add(set_headers_of(reply)["x-gateway-destination-endpoint"])
    assert seen == {f"127.0.0.1:{p}" for p in DEAD}


async def test_header_only_request_without_pods_is_500(start_app) -> None:
    app = await start_app([])
    (reply,) = await exchange(app, [headers_msg({":path": "/v1/models"}, end_of_stream=True)])
    ir = reply.immediate_response
    assert ir.status.code == 500
    assert ir.body == b"inference error: Internal - no pods available in datastore"


async def test_empty_subset_hint_is_503_with_drop_reason(start_app) -> None:
    app = await start_app(DEAD)
    (reply,) = await exchange(app, [headers_msg(H, subset=[]), body_msg(json.dumps(CHAT).encode())])
    ir = reply.immediate_response
    assert ir.status.code == 503
    assert ir.body == (
        b"inference error: ServiceUnavailable - failed to find endpoint "
        b"candidates for serving the request"
    )
    got = {h.header.key: h.header.raw_value for h in ir.headers.set_headers}
    assert got["x-llm-d-request-dropped-reason"] == b"rejected-no-endpoints"


async def test_subset_hint_matches_by_ip(start_app) -> None:
    app = await start_app(DEAD)
    replies = await exchange(
        app, [headers_msg(H, subset=["127.0.0.1:9"]), body_msg(json.dumps(CHAT).encode())]
    )
    assert set_headers_of(replies[0])["x-gateway-destination-endpoint"].startswith("127.0.0.1:")
    (reply,) = await exchange(
        app, [headers_msg(H, subset=["127.0.0.9:1"]), body_msg(json.dumps(CHAT).encode())]
    )
    assert reply.immediate_response.status.code == 503


async def test_request_trailers_are_answered(start_app) -> None:
    app = await start_app(DEAD)
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    replies = await exchange(
        app, [headers_msg(H), body_msg(json.dumps(CHAT).encode(), end_of_stream=False), trailers]
    )
    assert [r.WhichOneof("response") for r in replies] == [
        "request_headers",
        "request_body",
        "request_trailers",
    ]


async def test_buffered_mode_answers_headers_at_once_and_decides_on_body(start_app) -> None:
    app = await start_app(DEAD)
    first = headers_msg({**H, "x-llm-d-model-name-rewrite": "target"})
    first.protocol_config.request_body_mode = pb.ProcessingMode.BUFFERED
    body = json.dumps(CHAT).encode()
    replies = await exchange(app, [first, body_msg(body)])
    assert [r.WhichOneof("response") for r in replies] == ["request_headers", "request_body"]
    headers_reply = replies[0].request_headers.response  # only removes client control headers
    assert not headers_reply.header_mutation.set_headers
    assert "x-gateway-destination-endpoint" in headers_reply.header_mutation.remove_headers
    common = replies[1].request_body.response
    hdrs = {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}
    new_body = common.body_mutation.body
    assert json.loads(new_body)["model"] == "target"
    assert hdrs["content-length"] == str(len(new_body))
    assert common.clear_route_cache and "x-gateway-destination-endpoint" in hdrs


async def test_body_over_limit_is_413(start_app) -> None:
    app = await start_app(DEAD, max_request_body_bytes=1000)
    (reply,) = await exchange(
        app, [headers_msg(H), body_msg(b"x" * 600, end_of_stream=False), body_msg(b"x" * 600)]
    )
    assert reply.immediate_response.status.code == 413


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        pytest.param(
            "/v1/chat/completions", b"{", b"error unmarshaling request bodyMap", id="json"
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "a"}]}',
            b"model not found in request body",
            id="no-model",
        ),
        pytest.param(
            "/v1/chat/completions",
            b'{"model": "m", "messages": []}',
            b"BadRequest",
            id="no-messages",
        ),
    ],
)
async def test_bad_bodies_are_400(start_app, path: str, body: bytes, message: bytes) -> None:
    app = await start_app(DEAD)
    (reply,) = await exchange(app, [headers_msg({":path": path}), body_msg(body)])
    assert reply.immediate_response.status.code == 400
    assert message in reply.immediate_response.body


async def test_response_phase_restores_model_and_reads_served_endpoint(start_app) -> None:
    app = await start_app(
        DEAD,
        """\
        plugins:
        - type: queue-scorer
        - type: destination-endpoint-served-verifier
        """,
    )
    served = struct_pb2.Struct()
    served.update({"x-gateway-destination-endpoint-served": P2})
    resp_headers = headers_msg({":status": "200", "content-type": "application/json"})
    resp_headers = pb.ProcessingRequest(response_headers=resp_headers.request_headers)
    resp_headers.metadata_context.filter_metadata["envoy.lb"].CopyFrom(served)
    upstream = json.dumps(
        {"model": "target", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    ).encode()
    replies = await exchange(
        app,
        [
            headers_msg({**H, "x-llm-d-model-name-rewrite": "target"}),
            body_msg(json.dumps({**CHAT, "model": "alias"}).encode()),
            resp_headers,
            pb.ProcessingRequest(response_body=pb.HttpBody(body=upstream[:20])),
            pb.ProcessingRequest(response_body=pb.HttpBody(body=upstream[20:], end_of_stream=True)),
        ],
    )
    kinds = [r.WhichOneof("response") for r in replies]
    assert kinds == ["request_headers", "request_body", "response_headers", "response_body"]
    rh = {
        h.header.key: h.header.raw_value.decode()
        for h in replies[2].response_headers.response.header_mutation.set_headers
    }
    assert rh["x-went-into-resp-headers"] == "true"
    assert rh["x-conformance-test-served-endpoint"] == P2
    out = replies[3].response_body.response.body_mutation.streamed_response
    assert json.loads(out.body)["model"] == "alias" and out.end_of_stream


async def test_raising_scorer_counts_and_scores_zero(start_app) -> None:
    app = await start_app(
        DEAD,
        with_ports("""\
        plugins:
        - type: test-raising-scorer
        - type: test-constant-scorer
          parameters: {value: 1.0, ports: [PORT2]}
        """),
        registry=registry_with_test_plugins(),
    )
    replies = await exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())])
    assert set_headers_of(replies[0])["x-gateway-destination-endpoint"] == P2
    metric = app.metrics.registry.get_sample_value(
        "llm_d_epp_plugin_errors_total",
        {
            "extension_point": "Scorer",
            "plugin_type": "test-raising-scorer",
            "plugin_name": "test-raising-scorer",
        },
    )
    assert metric == 1.0


async def test_pre_request_plugin_sets_upstream_headers_and_client_cannot_forge_them(
    start_app,
) -> None:
    app = await start_app(
        DEAD,
        with_ports("""\
        plugins:
        - type: test-header-setter
          parameters: {header: x-prefiller-host-port}
        - type: test-constant-scorer
          parameters: {value: 1.0, ports: [PORT2]}
        """),
        registry=registry_with_test_plugins(),
    )
    forged = {**H, "x-prefiller-host-port": "10.9.9.9:1"}
    replies = await exchange(app, [headers_msg(forged), body_msg(json.dumps(CHAT).encode())])
    mutation = replies[0].request_headers.response.header_mutation
    assert set_headers_of(replies[0])["x-prefiller-host-port"] == P2
    assert "x-prefiller-host-port" not in mutation.remove_headers  # replaced, not left behind
    # Without the plugin the forged value is removed instead of forwarded.
    plain = await start_app(DEAD, "plugins:\n- type: queue-scorer\n")
    replies = await exchange(plain, [headers_msg(forged), body_msg(json.dumps(CHAT).encode())])
    mutation = replies[0].request_headers.response.header_mutation
    assert "x-prefiller-host-port" in mutation.remove_headers
    assert "x-prefiller-host-port" not in set_headers_of(replies[0])


async def test_raising_filter_is_500_and_server_keeps_serving(start_app) -> None:
    app = await start_app(
        DEAD,
        """\
        plugins:
        - type: test-raising-filter
        """,
        registry=registry_with_test_plugins(),
    )
    for _ in range(2):
        (reply,) = await exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())])
        assert reply.immediate_response.status.code == 500
        assert (
            b"filter test-raising-filter/test-raising-filter failed"
            in reply.immediate_response.body
        )


async def test_emit_endpoint_scores_adds_a_score_per_candidate(start_app) -> None:
    app = await start_app(DEAD, emit_endpoint_scores=True)
    replies = await exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())])
    scores = lb(replies[0])["x-gateway-destination-endpoint-scores"]
    assert set(dict(scores)) == {f"127.0.0.1:{p}" for p in DEAD}


async def health(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
        return int(resp.status)


async def test_health_serving_when_ready_and_not_serving_when_draining(start_app) -> None:
    app = await start_app(DEAD, drain_timeout=30.0)
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in (
        "",
        "liveness",
        "readiness",
        "envoy.service.ext_proc.v3.ExternalProcessor",
        "inference-extension",
    ):
        assert await health(app.health_port, name) == serving
    app.stop()  # SIGTERM path: draining, but still serving ext_proc during the window
    await asyncio.sleep(0.1)
    assert await health(app.health_port, "readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert await health(app.health_port, "liveness") == serving
    replies = await exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())])
    assert replies[0].WhichOneof("response") == "request_headers"


async def test_not_ready_before_discovery_and_first_scrape(start_app, tmp_path) -> None:
    app = await start_app(DEAD, ready=False)
    await app.wait_ready(60)
    assert app.ready()


async def test_a_request_before_the_first_discovery_sync_is_routed_once_it_lands(
    start_app, monkeypatch
) -> None:
    # A restarted EPP accepts on its ext_proc port before discovery has read its file; a
    # request that comes in then waits for the first sync instead of getting the empty pool's 503.
    from epp.plugins.sources import file_discovery

    read, gate = file_discovery._read, threading.Event()

    def held_read(path):  # the first read of the endpoints file ends when the test says so
        gate.wait(10)
        return read(path)

    monkeypatch.setattr(file_discovery, "_read", held_read)
    app = await start_app(DEAD, ready=False)
    director, waiting = app.context.director, asyncio.Semaphore(0)
    wait = director.first_discovery

    async def first_discovery():
        waiting.release()  # a request has come in before the sync
        await wait()

    director.first_discovery = first_discovery
    assert not app.discovered.is_set()
    both = asyncio.gather(
        exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())]),
        exchange(app, [headers_msg({":path": "/v1/models"}, end_of_stream=True)]),
    )
    for _ in range(2):
        await asyncio.wait_for(waiting.acquire(), 10)
    gate.set()
    body, header_only = await both
    assert app.discovered.is_set()
    for replies in (body, header_only):
        assert replies[0].WhichOneof("response") == "request_headers", replies[0]
        assert set_headers_of(replies[0])["x-gateway-destination-endpoint"] in {P1, P2, P3}


async def test_legacy_admission_sheds_only_sheddable_requests_when_saturated(start_app) -> None:
    # Closed ports never yield metrics, so utilization-detector reports saturation 1.0.
    app = await start_app(DEAD)
    app.objectives.replace({"batch": -1, "interactive": 5})
    shed = {**H, "x-llm-d-inference-objective": "batch"}
    (reply,) = await exchange(app, [headers_msg(shed), body_msg(json.dumps(CHAT).encode())])
    assert reply.immediate_response.status.code == 429
    assert reply.immediate_response.body == (
        b"inference error: ResourceExhausted - system saturated, sheddable request dropped"
    )
    kept = {**H, "x-llm-d-inference-objective": "interactive"}
    replies = await exchange(app, [headers_msg(kept), body_msg(json.dumps(CHAT).encode())])
    assert replies[0].WhichOneof("response") == "request_headers"


async def test_picker_with_several_endpoints_gives_an_ordered_fallback_list(start_app) -> None:
    app = await start_app(
        DEAD,
        with_ports("""\
        plugins:
        - type: test-constant-scorer
          parameters: {value: 1.0, ports: [PORT3]}
        - type: max-score-picker
          parameters: {maxNumOfEndpoints: 2}
        """),
        registry=registry_with_test_plugins(),
    )
    replies = await exchange(app, [headers_msg(H), body_msg(json.dumps(CHAT).encode())])
    dest = set_headers_of(replies[0])["x-gateway-destination-endpoint"]
    first, second = dest.split(",")
    assert first == P3 and second in {P1, P2}
    assert lb(replies[0])["x-gateway-destination-endpoint"] == dest


async def test_explain_view_shows_each_scorer_and_the_rejections(start_app) -> None:
    app = await start_app(
        DEAD,
        with_ports("""\
        plugins:
        - type: test-constant-scorer
          parameters: {value: 0.5, ports: [PORT3]}
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - {pluginRef: test-constant-scorer, weight: 4}
          - {pluginRef: queue-scorer, weight: 1}
        """),
        registry=registry_with_test_plugins(),
    )
    await exchange(
        app, [headers_msg({**H, "x-request-id": "explain-me"}), body_msg(json.dumps(CHAT).encode())]
    )
    await exchange(app, [headers_msg({**H, "x-request-id": "bad-one"}), body_msg(b"{")])
    async with aiohttp.ClientSession() as s:
        base = f"http://127.0.0.1:{app.metrics_port}/debug/decisions"
        async with s.get(f"{base}/explain-me") as r:
            entry = await r.json()
        async with s.get(f"{base}?limit=5") as r:
            latest = (await r.json())["decisions"]
        async with s.get(f"{base}/nope") as r:
            assert r.status == 404
    prof = entry["profiles"]["default"]
    assert prof["targets"] == [P3]
    best = prof["scores"][0]
    assert best["endpoint"] == P3 and best["total"] == 2.0  # 0.5·4 + 0 (no metrics)
    assert best["scorers"] == {
        "test-constant-scorer/test-constant-scorer": 0.5,
        "queue-scorer/queue-scorer": 0.0,
    }
    assert entry["candidates"] == 3 and entry["model"] == "m"
    assert [d["requestId"] for d in latest] == ["bad-one", "explain-me"]
    assert latest[0]["status"] == 400 and latest[0]["outcome"] == "rejected"
