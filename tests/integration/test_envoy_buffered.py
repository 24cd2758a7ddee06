"""Through a real Envoy in BUFFERED mode with fail-open (`epp envoy-config --body buffered`)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import COMPLETION, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]


async def test_buffered_body_is_routed_by_the_epp(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(3)
    for url, q in zip(fleet.urls, [4, 4, 0], strict=True):
        await set_overrides(url, num_requests_waiting=q)
    app = await start_app(fleet.ports)
    await settle(app, lambda m: all(x is not None and x.update_time for x in m.values()))
    proxy = envoy(app, "buffered-failopen", fallback=[("127.0.0.1", p) for p in fleet.ports])
    for _ in range(4):
        status, headers, body = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200, body
        assert headers["x-sim-pod"] == "pod-2"
    # model rewrite in BUFFERED mode: Envoy needs the new content-length with the new body
    status, _, body = await post(
        f"{proxy.url}/v1/completions",
        {**COMPLETION, "model": "alias"},
        {"x-llm-d-model-name-rewrite": "sim-model"},
    )
    assert status == 200, body


async def test_epp_down_fails_open_round_robin_and_strips_spoofed_header(
    start_app,
    sim_pods,
    envoy,
) -> None:
    fleet = await sim_pods(3)
    app = await start_app(fleet.ports)
    proxy = envoy(app, "buffered-failopen", fallback=[("127.0.0.1", p) for p in fleet.ports])
    assert (await post(f"{proxy.url}/v1/completions", COMPLETION))[0] == 200
    await app.__aexit__(None, None, None)  # the EPP goes away; Envoy stays
    served: Counter[str] = Counter()
    spoof = {"x-gateway-destination-endpoint": "127.0.0.1:1"}  # a dead port
    for _ in range(6):
        status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION, spoof)
        assert status == 200
        served[headers["x-sim-pod"]] += 1
    assert set(served) == {"pod-0", "pod-1", "pod-2"}
