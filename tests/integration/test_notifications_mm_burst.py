"""Through a real Envoy to simulated pods, with configurations shaped like upstream's samples for
endpoint notifications, the multimodal embeddings cache and the burst prefix cache:

- the EPP starts and routes although the token producer's vLLM render URL and the KV-event
  publishers are absent, and says so (metrics, logs);
- a repeated image follows the pod that saw it first (``mm-embeddings-cache-scorer``);
- a burst of shared-prompt requests lands on one pod per prompt (``burst-prefix-cache-producer``);
- the notification observers hear endpoints come and go as the discovery file changes.
"""

from __future__ import annotations

import asyncio
import logging
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from epp.plugins.producers.precise_prefix import pool as precise_pool
from epp.plugins.producers.precise_prefix import producer as precise_producer
from epp_tools.stack.envoy import free_port
from tests.conftest import metrics_text, post, wait_for

pytestmark = [pytest.mark.envoy]

MODEL = "sim-model"
PRECISE = "precise-prefix-cache-producer"
MM = "mm-embeddings-cache-producer"


def multimodal_config(render_port: int, kv_port: int) -> str:
    """Our words for upstream's multimodal sample: precise prefix + encoder-cache affinity, both
    producers hearing endpoint notifications; the render URL and publishers point at nothing."""
    return f"""\
        plugins:
        - type: token-producer
          parameters:
            backend: vllm
            modelName: {MODEL}
            vllm: {{url: "http://127.0.0.1:{render_port}", timeout: 1s}}
        - type: endpoint-notification-source
        - type: metrics-data-source
        - type: core-metrics-extractor
        - type: {MM}
          parameters: {{cacheSizeInMB: 64}}
        - type: mm-embeddings-cache-scorer
        - type: {PRECISE}
          parameters:
            tokenProcessorConfig: {{blockSize: 64}}
            kvEventsConfig: {{podDiscoveryConfig: {{socketPort: {kv_port}}}}}
            indexerConfig:
              kvBlockIndexConfig: {{enableMetrics: true, metricsLoggingInterval: 200000000}}
        - type: prefix-cache-scorer
          parameters: {{prefixMatchInfoProducerName: {PRECISE}}}
        - type: queue-scorer
        - type: max-score-picker
        - type: single-profile-handler
        - type: decode-filter
        schedulingProfiles:
        - name: default
          plugins:
          - pluginRef: decode-filter
          - pluginRef: prefix-cache-scorer
            weight: 10
          - pluginRef: mm-embeddings-cache-scorer
            weight: 4
          - pluginRef: queue-scorer
            weight: 1
          - pluginRef: max-score-picker
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors: [{{pluginRef: core-metrics-extractor}}]
          - pluginRef: endpoint-notification-source
            extractors: [{{pluginRef: {MM}}}, {{pluginRef: {PRECISE}}}]
        """


BURST_CONFIG = f"""\
    plugins:
    - type: token-producer
      parameters:
        modelName: {MODEL}
        vllm: {{url: "http://127.0.0.1:1"}}
    - type: single-profile-handler
    - type: decode-filter
    - type: burst-prefix-cache-producer
      parameters: {{windowDurationMs: 300, maxPerReplica: -1, minColocateBlocks: 0}}
    - type: prefix-cache-scorer
      parameters: {{prefixMatchInfoProducerName: burst-prefix-cache-producer}}
    - type: load-aware-scorer
    - type: max-score-picker
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: decode-filter
      - pluginRef: prefix-cache-scorer
        weight: 2.0
      - pluginRef: load-aware-scorer
        weight: 1.0
      - pluginRef: max-score-picker
    """


def chat_with_image(url: str, text: str = "What is in this picture?") -> dict[str, Any]:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}


def endpoints_file(path: Path, pods: Sequence[tuple[int, int]]) -> None:
    """Rewrite the discovery file: ``(pod index, port)`` pairs keep each pod's name."""
    lines = ["endpoints:"]
    for i, port in pods:
        lines += [f"- name: pod-{i}", "  namespace: default", "  address: 127.0.0.1"]
        lines.append(f"  port: '{port}'")
    path.write_text("\n".join(lines) + "\n")


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in a Prometheus text page (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and all(p in line for p in want.split(",")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def quick_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Report silent publishers after 0.5 s instead of 30 s."""
    monkeypatch.setattr(precise_pool, "SILENT_AFTER", 0.5)
    monkeypatch.setattr(precise_producer, "WATCH_EVERY", 1)


async def test_repeated_image_follows_its_pod_when_render_and_publishers_are_absent(
    start_app: Any, sim_pods: Any, envoy: Any, quick_watch: None, caplog: Any
) -> None:
    fleet = await sim_pods(3)
    with caplog.at_level(logging.INFO):
        app = await start_app(
            fleet.ports, textwrap.dedent(multimodal_config(free_port(), free_port()))
        )
        proxy = envoy(app)
        pods = []
        for i in range(4):
            status, headers, _ = await post(
                f"{proxy.url}/v1/chat/completions", chat_with_image("http://img/cat.png", f"q{i}")
            )
            assert status == 200
            pods.append(headers["x-sim-pod"])
        status, _, _ = await post(
            f"{proxy.url}/v1/chat/completions", chat_with_image("http://img/dog.png")
        )
        assert status == 200
        producer = app.pipeline.instances[PRECISE]
        assert producer.dump_state()["subscriptions"]["pool"] == "notified"
        await wait_for(lambda: len(producer.watch.silent) == 3, 5)
        await wait_for(lambda: any("metrics beat" in r.getMessage() for r in caplog.records), 5)
    assert len(set(pods)) == 1, pods  # the image's pod keeps it once it has seen it
    text = await metrics_text(app)
    mm = {"plugin_type": MM, "plugin_name": MM}
    assert sample(text, "llm_d_epp_encoder_cache_queries_total", **mm, modality="image") == 5
    assert sample(text, "llm_d_epp_encoder_cache_hits_total", **mm, modality="image") == 3
    # the absent render URL: the token producer fell back, counted
    assert sample(text, "llm_d_epp_token_producer_fallbacks_total") >= 1
    # the absent publishers: subscribed, silent, reported
    assert sample(text, "llm_d_epp_kv_cache_events_active_subscribers", plugin_name=PRECISE) == 3
    assert sample(text, "llm_d_epp_precise_prefix_silent_publishers", plugin_name=PRECISE) == 3
    assert any("no KV events from" in r.getMessage() for r in caplog.records)
    assert sample(text, "llm_d_epp_kv_cache_index_lookup_requests_total", plugin_name=PRECISE) >= 5


async def test_burst_of_shared_prompts_lands_on_one_pod_per_prompt(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(3)
    app = await start_app(fleet.ports, BURST_CONFIG, allow_experimental_plugins=True)
    proxy = envoy(app)
    prompts = {
        "a": "Solve step by step: " + "the quick brown fox jumps over the lazy dog " * 12,
        "b": "Translate to French: " + "a completely different rollout prompt here " * 12,
    }

    async def sample_of(group: str) -> tuple[str, str]:
        body = {"model": MODEL, "prompt": prompts[group], "max_tokens": 2}
        status, headers, _ = await post(f"{proxy.url}/v1/completions", body)
        assert status == 200
        return group, headers["x-sim-pod"]

    await sample_of("a")  # warm Envoy's connections so each burst arrives within one window
    for _ in range(2):  # two bursts: each group stays together in each
        placed = await asyncio.gather(*(sample_of(g) for g in "abababab"))
        by_group = {g: Counter(pod for gg, pod in placed if gg == g) for g in prompts}
        assert all(len(pods) == 1 for pods in by_group.values()), by_group
        assert next(iter(by_group["a"])) != next(iter(by_group["b"])), by_group
    burst = app.pipeline.instances["burst-prefix-cache-producer"]
    assert burst.outcomes["colocated"] == 16  # the warm-up request was alone: no affinity
    assert burst.outcomes["unplaced"] == 1


async def test_observers_hear_endpoints_join_and_leave_the_discovery_file(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(3)
    ports = fleet.ports
    app = await start_app(ports[:2], textwrap.dedent(multimodal_config(free_port(), free_port())))
    precise = app.pipeline.instances[PRECISE]
    mm = app.pipeline.instances[MM]
    source = app.pipeline.instances["endpoint-notification-source"]
    ids = [f"default/pod-{i}" for i in range(3)]
    await wait_for(lambda: set(precise.hub.targets()) == set(ids[:2]), 5)
    proxy = envoy(app)
    status, headers, _ = await post(
        f"{proxy.url}/v1/chat/completions", chat_with_image("http://i/x")
    )
    assert status == 200
    seen = f"default/{headers['x-sim-pod']}"
    assert set(mm.caches) == {seen}

    endpoints_file(app.endpoints_file, [(0, ports[0]), (1, ports[1]), (2, ports[2])])
    await wait_for(lambda: set(precise.hub.targets()) == set(ids), 5)
    keep = [(i, ports[i]) for i in range(3) if ids[i] != seen]
    endpoints_file(app.endpoints_file, keep)
    await wait_for(lambda: seen not in precise.hub.targets(), 5)
    assert mm.caches == {}  # dropped on the event, not by the two-minute sweep
    assert set(precise.hub.targets()) == {ids[i] for i, _ in keep}
    assert precise.dump_state()["subscriptions"]["pool"] == "notified"
    assert source.dump_state() == {"events": {"add-or-update": 3, "delete": 1}}
    # routing follows the new pool
    status, headers, _ = await post(
        f"{proxy.url}/v1/chat/completions", chat_with_image("http://i/x")
    )
    assert status == 200 and f"default/{headers['x-sim-pod']}" != seen
