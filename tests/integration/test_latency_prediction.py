"""Latency prediction through a real Envoy, on simulated pods: llm-d's latency-predictor config
as its Helm chart renders it (and each plugin's README example) starts unchanged and routes; with
no sidecar the in-process model learns from the EPP's own completions and then predicts; with a
server speaking the sidecar's protocol (``tests.latency_sidecar``) its predictions steer routing
and the SLO admitter, and completions are sent back to train."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.conftest import COMPLETION, metrics_text, post, set_overrides, wait_for
from tests.latency_configs import GUIDE_CONFIGS, HELM_LATENCY, README_EXAMPLES
from tests.latency_sidecar import SidecarServer

pytestmark = [pytest.mark.envoy]

SLO_ROUTING = """\
plugins:
- type: predicted-latency-producer
- type: slo-headroom-tier-filter
  parameters: {epsilonExploreNeg: 0}
- type: latency-scorer
- type: max-score-picker
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
"""
# SLO_ROUTING with a saturation detector that never reports the pool saturated, so that legacy
# shedding (which fails closed on a late scrape) never answers before the admitter does.
SHEDDING = (
    SLO_ROUTING.replace(
        "- type: latency-slo-admitter\n",
        "- type: latency-slo-admitter\n- type: concurrency-detector\n"
        "  parameters: {maxConcurrency: 100000}\n",
    )
    + "saturationDetector: {pluginRef: concurrency-detector}\n"
)
STREAMING = """\
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true, modelMinSamples: 8}
- type: latency-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
"""


def _producer(app: Any) -> Any:
    return next(
        p for p in app.pipeline.producers if p.typed_name.type == "predicted-latency-producer"
    )


def _prompt(i: int) -> dict[str, Any]:
    return {**COMPLETION, "prompt": f"request {i}: " + "tell me about routing " * (5 + i % 7)}


async def _overrides(fleet: Any, values: dict[int, dict[str, Any]]) -> None:
    for i, v in values.items():
        await set_overrides(fleet.urls[i], **v)


async def _scraped(app: Any, fleet: Any, waiting: dict[int, int]) -> None:
    """Wait until the EPP's scrapes show pod ``i``'s pinned waiting queue ``waiting[i]``."""

    def seen() -> bool:
        got = {e.port: e.metrics for e in app.store.snapshot()}
        return all(
            (m := got.get(fleet.ports[i])) is not None and m.waiting_queue_size == n
            for i, n in waiting.items()
        )

    await wait_for(seen, 10)


async def test_helm_latency_config_learns_in_process_and_predicts(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(4)
    app = await start_app(fleet.ports, HELM_LATENCY)
    producer = _producer(app)
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    for i in range(40):  # the model predicts after 32 completions (modelMinSamples)
        status, _, body = await post(url, _prompt(i))
        assert status == 200, body
    await wait_for(lambda: producer.dump_state()["model"]["learned"] >= 32, 10)
    pods = set()
    for i in range(40, 60):
        status, headers, _ = await post(url, _prompt(i))
        assert status == 200
        pods.add(headers["x-sim-pod"])
    state = producer.dump_state()
    assert state["mode"] == "in-process"
    assert state["predictionError"]["ttft"]["n"] >= 15  # predicted, then measured
    assert len(pods) > 1  # the weighted-random picker spreads the load
    assert "llm_d_epp_request_predicted_ttft_seconds_count" in await metrics_text(app)


@pytest.mark.parametrize("name", sorted(README_EXAMPLES))
async def test_upstream_readme_examples_start_and_route(
    name: str, start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(2)
    # the fixture adds file discovery to a body laid out at the left margin: same YAML, re-dumped
    body = yaml.safe_dump(yaml.safe_load(README_EXAMPLES[name]), sort_keys=False)
    app = await start_app(fleet.ports, body)
    proxy = envoy(app)
    headers = {"x-llm-d-slo-ttft-ms": "500"}
    for i in range(3):
        status, _, body = await post(f"{proxy.url}/v1/completions", _prompt(i), headers)
        assert status == 200, body


async def test_streaming_mode_learns_ttft_and_tpot_from_the_stream(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports, STREAMING)
    producer = _producer(app)
    proxy = envoy(app)
    url = f"{proxy.url}/v1/chat/completions"

    async def stream(i: int) -> None:
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": f"question {i} " * 30}],
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        status, _, text = await post(url, body)
        assert status == 200 and b"[DONE]" in text

    for i in range(10):
        await stream(i)
    await wait_for(lambda: producer.dump_state()["model"]["tpotSamples"] >= 8, 10)
    for i in range(10, 14):  # predicted now, then measured
        await stream(i)
    error = producer.dump_state()["predictionError"]
    assert error["ttft"]["n"] >= 4 and error["tpot"]["n"] >= 4


async def test_sidecar_predictions_steer_routing_and_completions_train_it(
    start_app: Any, sim_pods: Any, envoy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar predicts 20 ms of TTFT per waiting request: with pods 0 and 1 pinned at 10
    waiting and a 150 ms TTFT SLO, only pods 2 and 3 meet it."""
    async with SidecarServer() as sidecar:
        monkeypatch.setenv("PREDICTION_SERVER_URL", sidecar.url)
        monkeypatch.setenv("TRAINING_SERVER_URL", sidecar.url)
        monkeypatch.setenv("LATENCY_FLUSH_INTERVAL_SEC", "1")
        fleet = await sim_pods(4)
        await _overrides(fleet, {0: {"num_requests_waiting": 10}, 1: {"num_requests_waiting": 10}})
        app = await start_app(fleet.ports, SLO_ROUTING)
        await _scraped(app, fleet, {0: 10, 1: 10, 2: 0, 3: 0})
        proxy = envoy(app)
        slo = {"x-llm-d-slo-ttft-ms": "150"}
        pods = []
        for i in range(12):
            status, headers, body = await post(f"{proxy.url}/v1/completions", _prompt(i), slo)
            assert status == 200, body
            pods.append(headers["x-sim-pod"])
        assert set(pods) <= {"pod-2", "pod-3"}, pods
        assert all(len(rows) == 4 for rows in sidecar.predict_calls)
        await wait_for(lambda: len(sidecar.training) >= 12, 10)
    entry = sidecar.training[0]
    assert entry["actual_ttft_ms"] > 0 and entry["num_request_waiting"] == 0
    assert _producer(app).dump_state()["sidecar"]["trainingSent"] >= 12


async def test_sidecar_verdict_sheds_sheddable_requests_only(
    start_app: Any, sim_pods: Any, envoy: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    objectives = tmp_path / "objectives.yaml"
    objectives.write_text(
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\n"
        "metadata: {name: batch}\nspec: {priority: -1}\n"
    )
    async with SidecarServer() as sidecar:
        monkeypatch.setenv("PREDICTION_SERVER_URL", sidecar.url)
        fleet = await sim_pods(2)
        # busy: neither idle nor cold
        busy = {"num_requests_waiting": 4, "num_requests_running": 4, "kv_cache_usage_perc": 0.5}
        await _overrides(fleet, {0: busy, 1: busy})
        app = await start_app(fleet.ports, SHEDDING, objectives_files=(str(objectives),))
        await _scraped(app, fleet, {0: 4, 1: 4})
        proxy = envoy(app)
        url = f"{proxy.url}/v1/completions"
        slo = {"x-llm-d-slo-ttft-ms": "100"}
        status, headers, body = await post(
            url, _prompt(0), {**slo, "x-llm-d-inference-objective": "batch"}
        )
        assert status == 429, body
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert b"latency-slo-admitter" in body
        status, _, _ = await post(url, _prompt(1), slo)  # not sheddable: routed anyway
        assert status == 200
        status, _, _ = await post(url, _prompt(2), {"x-llm-d-inference-objective": "batch"})
        assert status == 200  # no SLO: nothing to judge


async def test_sidecar_down_routes_on_scraped_metrics(
    start_app: Any, sim_pods: Any, envoy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every prediction fails: the requests are routed all the same, by the scorer's composite of
    the scraped metrics (max-score picker: the pod that queues less)."""
    async with SidecarServer(status=503) as sidecar:
        monkeypatch.setenv("PREDICTION_SERVER_URL", sidecar.url)
        monkeypatch.setenv("TRAINING_SERVER_URL", sidecar.url)
        fleet = await sim_pods(2)
        await _overrides(fleet, {0: {"num_requests_waiting": 3}})
        app = await start_app(fleet.ports, SLO_ROUTING)
        await _scraped(app, fleet, {0: 3, 1: 0})
        proxy = envoy(app)
        pods = []
        for i in range(6):
            status, headers, _ = await post(f"{proxy.url}/v1/completions", _prompt(i))
            assert status == 200
            pods.append(headers["x-sim-pod"])
        assert len(sidecar.predict_calls) == 6  # asked every time, failed every time
    assert pods == ["pod-1"] * 6
    assert _producer(app).dump_state()["sidecar"]["predictFailures"] == 6


async def test_helm_latency_config_with_a_sidecar_routes(
    start_app: Any, sim_pods: Any, envoy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SidecarServer() as sidecar:
        monkeypatch.setenv("PREDICTION_SERVER_URL", sidecar.url)
        monkeypatch.setenv("TRAINING_SERVER_URL", sidecar.url)
        fleet = await sim_pods(3)
        app = await start_app(fleet.ports, HELM_LATENCY)
        proxy = envoy(app)
        slo = {"x-llm-d-slo-ttft-ms": "400"}
        for i in range(6):
            status, _, body = await post(f"{proxy.url}/v1/completions", _prompt(i), slo)
            assert status == 200, body
        assert len(sidecar.predict_calls) == 6
    assert _producer(app).dump_state()["predictionError"]["ttft"]["n"] == 6


@pytest.mark.parametrize("name", sorted(GUIDE_CONFIGS))
async def test_llm_d_guide_configs_start_and_route(
    name: str, start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    """llm-d's predicted-latency routing guide, each of its configs unchanged (the fixture adds
    file discovery); pod-0 is a prefill pod and pod-1 a decode pod, as the P/D variant needs. The
    multimodal variant's requests carry an image."""
    fleet = await sim_pods(4)
    doc = yaml.safe_load(GUIDE_CONFIGS[name])
    config = yaml.safe_dump({k: v for k, v in doc.items() if k not in ("apiVersion", "kind")})
    roles = {0: {"llm-d.ai/role": "prefill"}, 1: {"llm-d.ai/role": "decode"}}
    app = await start_app(fleet.ports, config, labels=roles)
    proxy = envoy(app)
    headers = {"x-llm-d-slo-ttft-ms": "2000", "x-llm-d-slo-tpot-ms": "200"}
    for i in range(6):
        content: Any = f"hi {i}"
        if name.endswith("multimodal"):
            image = {"type": "image_url", "image_url": {"url": f"https://example.com/{i}.png"}}
            content = [{"type": "text", "text": content}, image]
        body = {"model": "sim-model", "messages": [{"role": "user", "content": content}],
                "max_tokens": 4, "stream": True}  # fmt: skip
        status, _, text = await post(f"{proxy.url}/v1/chat/completions", body, headers)
        assert status == 200 and b"[DONE]" in text, text[:300]


async def test_prefix_affinity_filter_keeps_a_shared_prompt_on_the_pod_that_caches_it(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    """Under a random picker, requests sharing a long prompt prefix all go where the first one
    went once that pod caches it: the filter narrows the candidates to it."""
    config = """\
plugins:
- type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.8}
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-affinity-filter
  - pluginRef: random-picker
"""
    fleet = await sim_pods(4)
    app = await start_app(fleet.ports, config)
    proxy = envoy(app)
    shared = "the same long system prompt " * 60
    pods = []
    for i in range(12):
        body = {**COMPLETION, "prompt": shared + f"question {i}"}
        status, headers, _ = await post(f"{proxy.url}/v1/completions", body)
        assert status == 200
        pods.append(headers["x-sim-pod"])
    assert len(set(pods[1:])) == 1 and pods[1] == pods[0], pods
