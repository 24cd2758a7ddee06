"""Disaggregated serving through a real Envoy (FULL_DUPLEX_STREAMED) to simulated pods labelled by
role: the decode profile never lands on a prefill-only pod, and the P/D header reaches the decode
pod exactly when its prefix is not cached (the simulator echoes the ``x-prefiller-host-port`` it
received as ``x-sim-saw-prefiller``)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import COMPLETION, metrics_text, post, set_overrides, settle

pytestmark = [pytest.mark.envoy]

PREFILL = {"llm-d.ai/role": "prefill"}
DECODE = {"llm-d.ai/role": "decode"}

# In the style of upstream's deploy/config/pd-epp-config.yaml, the handler before its decider.
# Fixed 64-token index blocks so "cached" is exact: a 4096-byte prompt is 1024 estimate tokens.
PD_CONFIG = """\
    plugins:
    - type: approx-prefix-cache-producer
      parameters:
        autoTune: false
        blockSizeTokens: 64
    - type: prefix-cache-scorer
    - type: queue-scorer
    - type: prefill-filter
    - type: decode-filter
    - type: max-score-picker
    - type: disagg-profile-handler
      parameters:
        deciders:
          prefill: prefix-based-pd-decider
    - type: prefix-based-pd-decider
      parameters:
        nonCachedTokens: 16
    schedulingProfiles:
    - name: prefill
      plugins:
      - pluginRef: prefill-filter
      - pluginRef: max-score-picker
      - pluginRef: prefix-cache-scorer
        weight: 2
      - pluginRef: queue-scorer
        weight: 1
    - name: decode
      plugins:
      - pluginRef: decode-filter
      - pluginRef: max-score-picker
      - pluginRef: prefix-cache-scorer
        weight: 2
      - pluginRef: queue-scorer
        weight: 1
    """


async def test_decode_filter_never_routes_to_a_prefill_only_pod(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(3)
    # The prefill pod is by far the idlest: without the filter the queue scorer would pick it.
    for url, queue in zip(fleet.urls, (0, 6, 6), strict=True):
        await set_overrides(url, num_requests_waiting=queue)
    app = await start_app(
        fleet.ports,
        """\
        plugins:
        - type: decode-filter
        - type: queue-scorer
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: decode-filter
          - pluginRef: queue-scorer
        """,
        labels={0: PREFILL, 1: DECODE},  # pod-2 is unlabeled: a decode pod
    )
    busy = fleet.ports[1:]
    await settle(app, lambda m: all(m[p] is not None and m[p].waiting_queue_size for p in busy))
    proxy = envoy(app)
    served = set()
    for _ in range(12):
        status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
        assert status == 200
        served.add(headers["x-sim-pod"])
    assert served <= {"pod-1", "pod-2"}


async def test_pd_sets_prefiller_header_for_an_uncached_long_prompt_only(
    start_app, sim_pods, envoy
) -> None:
    fleet = await sim_pods(3)
    app = await start_app(fleet.ports, PD_CONFIG, labels={0: PREFILL, 1: DECODE, 2: DECODE})
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    prefill_pod = f"127.0.0.1:{fleet.ports[0]}"
    long_prompt = {**COMPLETION, "prompt": "".join(f"{i:08d}" for i in range(512))}  # 4096 B

    status, first, _ = await post(url, long_prompt)
    assert status == 200
    assert first["x-sim-pod"] in {"pod-1", "pod-2"}
    assert first.get("x-sim-saw-prefiller") == prefill_pod

    # Same prompt: the decode pod that served it caches all of it, so no remote prefill; a value
    # the client sends for the EPP's header does not reach the pod either.
    forged = {"x-prefiller-host-port": "10.0.0.1:1"}
    status, second, _ = await post(url, long_prompt, headers=forged)
    assert status == 200
    assert second["x-sim-pod"] == first["x-sim-pod"]
    assert "x-sim-saw-prefiller" not in second

    # A prompt shorter than nonCachedTokens never disaggregates.
    status, short, _ = await post(url, {**COMPLETION, "prompt": "hi"})
    assert status == 200
    assert "x-sim-saw-prefiller" not in short

    text = await metrics_text(app)
    counts = dict(
        re.findall(
            r'llm_d_epp_disagg_decision_total\{decision_type="([^"]+)",model_name="sim-model",'
            r'plugin_name="disagg-profile-handler",plugin_type="disagg-profile-handler"\} (\S+)',
            text,
        )
    )
    assert counts == {"prefill-decode": "1.0", "decode-only": "2.0"}
