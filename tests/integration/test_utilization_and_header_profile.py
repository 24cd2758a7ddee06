"""``utilization-filter`` and ``header-profile-handler`` through a real Envoy to simulated pods."""

from __future__ import annotations

import pytest

from tests.conftest import COMPLETION, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]

UTILIZATION = """\
plugins:
- type: utilization-filter
  name: not-overloaded
  parameters:
    conditions:
    - {metric: waiting-queue, maxValue: 0}
    - {metric: kv-cache-utilization, maxValue: 0.8}
    fallbackOnEmpty: FALLBACK
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: not-overloaded
  - pluginRef: random-picker
"""


async def _served(url: str, n: int, headers: dict[str, str] | None = None) -> list[str]:
    out = []
    for i in range(n):
        body = {**COMPLETION, "prompt": f"request {i}"}
        status, got, answer = await post(f"{url}/v1/completions", body, headers)
        assert status == 200, answer
        out.append(got["x-sim-pod"])
    return out


@pytest.mark.parametrize("fallback", [False, True])
async def test_utilization_filter_keeps_requests_off_overloaded_pods(
    start_app, sim_pods, envoy, fallback: bool
) -> None:
    fleet = await sim_pods(3)
    await set_overrides(fleet.urls[0], num_requests_waiting=4)  # a queue
    await set_overrides(fleet.urls[1], kv_cache_usage_perc=0.95)  # a full cache
    config = UTILIZATION.replace("FALLBACK", str(fallback).lower())
    app = await start_app(fleet.ports, config, allow_experimental_plugins=True)
    await settle(
        app,
        lambda m: (
            m[fleet.ports[0]] is not None
            and m[fleet.ports[0]].waiting_queue_size == 4
            and m[fleet.ports[1]] is not None
            and m[fleet.ports[1]].kv_cache_usage_percent == 0.95
        ),
    )
    proxy = envoy(app)
    assert set(await _served(proxy.url, 12)) == {"pod-2"}  # random picks among what is left

    await set_overrides(fleet.urls[2], num_requests_waiting=1)  # now every pod is over a cap
    await settle(app, lambda m: m[fleet.ports[2]].waiting_queue_size == 1)
    if fallback:
        assert len(set(await _served(proxy.url, 12))) > 1  # routed among all of them
    else:
        status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 429
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"


STAGES = """\
plugins:
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: header-profile-handler
schedulingProfiles:
- name: encode
  plugins: [{pluginRef: encode-filter}]
- name: prefill
  plugins: [{pluginRef: prefill-filter}]
- name: decode
  plugins: [{pluginRef: decode-filter}]
"""


async def test_header_profile_handler_runs_the_profile_the_header_names(
    start_app, sim_pods, envoy
) -> None:
    fleet = await sim_pods(3)
    roles = {i: {"llm-d.ai/role": role} for i, role in enumerate(("encode", "prefill", "decode"))}
    app = await start_app(fleet.ports, STAGES, labels=roles, allow_experimental_plugins=True)
    proxy = envoy(app)
    assert set(await _served(proxy.url, 4, {"EPP-Profile": "encode"})) == {"pod-0"}
    assert set(await _served(proxy.url, 4, {"EPP-Profile": "prefill"})) == {"pod-1"}
    assert set(await _served(proxy.url, 4, {"EPP-Profile": "decode"})) == {"pod-2"}
    assert set(await _served(proxy.url, 4)) == {"pod-2"}  # no header: defaultProfile decode
    status, _, answer = await post(
        f"{proxy.url}/v1/completions", COMPLETION, {"EPP-Profile": "verify"}
    )
    assert status == 429, answer  # a profile nobody configured: no profile runs (upstream's 429)
    assert b"no profile ran" in answer
