"""Through a real Envoy (FULL_DUPLEX_STREAMED, as `epp envoy-config` generates) to simulated vLLM
pods: the EPP's decision is what Envoy routes on."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from tests.conftest import COMPLETION, metrics_text, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]


async def test_routes_to_lower_queue_and_kv_cache(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(3)
    for url, (q, kv) in zip(fleet.urls, [(3, 0.2), (0, 0.1), (10, 0.2)], strict=True):
        await set_overrides(url, num_requests_waiting=q, kv_cache_usage_perc=kv)
    app = await start_app(fleet.ports)
    await settle(
        app, lambda m: m[fleet.ports[2]] is not None and m[fleet.ports[2]].waiting_queue_size == 10
    )
    proxy = envoy(app)
    for _ in range(5):
        status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200
        assert headers["x-sim-pod"] == "pod-1"


async def test_routes_to_pod_with_active_lora(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(3, lora_adapters=("sql-lora",), max_loras=2)
    for i, url in enumerate(fleet.urls):
        await set_overrides(
            url,
            num_requests_waiting=0,
            kv_cache_usage_perc=0.1,
            running_lora_adapters=["sql-lora"] if i == 2 else [],
            waiting_lora_adapters=[],
            max_lora=1 if i != 2 else 2,
        )
    app = await start_app(
        fleet.ports,
        """\
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        - type: lora-affinity-scorer
        """,
    )
    await settle(app, lambda m: all(x is not None and x.max_active_models for x in m.values()))
    proxy = envoy(app)
    status, headers, _ = await post(
        f"{proxy.url}/v1/completions", {**COMPLETION, "model": "sql-lora"}
    )
    assert status == 200, headers
    assert headers["x-sim-pod"] == "pod-2"


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        pytest.param(
            b'{"model": "sim-model", "prompt": ',
            400,
            b"inference error: BadRequest - error unmarshaling request bodyMap",
            id="invalid-json",
        ),
        pytest.param(
            b'{"prompt": "hello world"}',
            400,
            b"inference error: BadRequest - model not found in request body",
            id="missing-model",
        ),
    ],
)
async def test_bad_request_body_gets_400(
    start_app, sim_pods, envoy, body: bytes, status: int, fragment: bytes
) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    got, _, text = await post(f"{proxy.url}/v1/completions", body)
    assert got == status
    assert text.startswith(fragment), text
    # and the EPP keeps serving
    assert (await post(f"{proxy.url}/v1/completions", COMPLETION))[0] == 200


async def test_body_split_across_chunks_is_reassembled(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    raw = json.dumps({**COMPLETION, "prompt": "x" * 50_000}).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 7_000):
            yield raw[i : i + 7_000]
            await asyncio.sleep(0.01)

    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{proxy.url}/v1/completions",
            data=chunks(),
            headers={"content-type": "application/json"},
        ) as r,
    ):
        assert r.status == 200
        assert (await r.json())["model"] == "sim-model"
    assert proxy.stats()["http.ingress.ext_proc.streams_started"] >= 1


async def test_subset_hint_limits_candidates(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(3)
    # The best pod by metrics is pod-1, but the data plane only allows pod-2.
    for url, q in zip(fleet.urls, [5, 0, 9], strict=True):
        await set_overrides(url, num_requests_waiting=q)
    app = await start_app(fleet.ports)
    await settle(app, lambda m: all(x is not None and x.update_time for x in m.values()))
    proxy = envoy(app)
    hint = {"x-test-subset-hint": f"127.0.0.1:{fleet.ports[2]}"}
    # every pod shares 127.0.0.1, and matching is by IP (upstream), so all three stay eligible
    status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION, hint)
    assert status == 200 and headers["x-sim-pod"] == "pod-1"
    status, headers, body = await post(
        f"{proxy.url}/v1/completions", COMPLETION, {"x-test-subset-hint": "10.9.9.9:8000"}
    )
    assert status == 503
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert b"failed to find endpoint candidates" in body


async def test_no_endpoints_gives_503(start_app, envoy) -> None:
    app = await start_app([])
    proxy = envoy(app)
    status, headers, body = await post(f"{proxy.url}/v1/completions", COMPLETION)
    assert status == 503
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert body.startswith(b"inference error: ServiceUnavailable")


async def test_sse_response_streams_with_usage(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports, response_body_sample_ratio=1.0)  # every body read
    proxy = envoy(app)
    req = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "hi there"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 5,
    }
    status, headers, body = await post(f"{proxy.url}/v1/chat/completions", req)
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == 5
    text = await metrics_text(app)
    assert 'llm_d_epp_request_output_tokens_count{model_name="sim-model"' in text
    assert (
        'llm_d_epp_request_output_tokens_sum{model_name="sim-model",'
        'target_model_name="sim-model"} 5.0' in text
    )


async def test_model_rewrite_header_and_response_restore(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    status, _, body = await post(
        f"{proxy.url}/v1/completions",
        {**COMPLETION, "model": "my-alias"},
        {"x-llm-d-model-name-rewrite": "sim-model"},
    )
    assert status == 200, body
    assert json.loads(body)["model"] == "my-alias"  # the pod saw sim-model, the client its alias
    text = await metrics_text(app)
    # The alias is the client's own name (no rewrite object names it): it is counted as unknown,
    # the target the pod answered 2xx for under its name (epp.observability.labels).
    assert 'model_name="unknown",target_model_name="sim-model"' in text
    assert "my-alias" not in text


async def test_spoofed_destination_header_is_not_routed_on(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(2)
    await set_overrides(fleet.urls[0], num_requests_waiting=50)
    app = await start_app(fleet.ports)
    await settle(
        app, lambda m: m[fleet.ports[0]] is not None and m[fleet.ports[0]].waiting_queue_size == 50
    )
    proxy = envoy(app)
    spoof = {
        "x-gateway-destination-endpoint": f"127.0.0.1:{fleet.ports[0]}",
        "x-prefiller-host-port": "10.0.0.66:8000",
    }
    for _ in range(3):
        status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION, spoof)
        assert status == 200
        assert headers["x-sim-pod"] == "pod-1"
        assert headers.get("x-sim-saw-prefiller", "") == ""


async def test_one_mib_body_is_forwarded_byte_identical(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1, max_model_len=1 << 20)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    raw = json.dumps({**COMPLETION, "prompt": "abcdefgh" * (1 << 17)}).encode()
    assert len(raw) > 1 << 20
    status, headers, _ = await post(f"{proxy.url}/v1/completions", raw)
    assert status == 200
    assert headers["x-sim-request-sha256"] == hashlib.sha256(raw).hexdigest()


async def test_body_over_limit_gets_413_and_epp_keeps_serving(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports, max_request_body_bytes=64 * 1024)
    proxy = envoy(app)
    raw = json.dumps({**COMPLETION, "prompt": "z" * 100_000}).encode()
    status, _, body = await post(f"{proxy.url}/v1/completions", raw)
    assert status == 413
    assert b"PayloadTooLarge" in body
    assert (await post(f"{proxy.url}/v1/completions", COMPLETION))[0] == 200


async def test_get_without_body_is_routed(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports)
    proxy = envoy(app)
    async with aiohttp.ClientSession() as s, s.get(f"{proxy.url}/v1/models") as r:
        assert r.status == 200
        assert (await r.json())["data"][0]["id"] == "sim-model"


async def test_default_tls_serving_works_behind_envoy(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports, secure_serving=True)  # self-signed certificate
    proxy = envoy(app)
    status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
    assert status == 200 and headers["x-sim-pod"] in {"pod-0", "pod-1"}
