"""``p2p-source-producer`` through a real Envoy: a prompt served by one simulated pod, then sent
again while that pod is busy, goes to the other pod with ``x-kv-cache-source-host-port`` naming
the first (read from Envoy's access log: the header as the model server receives it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMPLETION, post, set_overrides, settle, wait_for
from tests.envoy_access_log import logging_envoy

pytestmark = [pytest.mark.envoy]

CONFIG = """\
    plugins:
    - type: approx-prefix-cache-producer
      parameters: {autoTune: false, blockSizeTokens: 64}
    - type: p2p-source-producer
      parameters: {minCachedTokenDelta: 64}
    - type: queue-scorer
    - type: max-score-picker
    schedulingProfiles:
    - name: default
      plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
    """


async def test_the_pod_without_the_prefix_is_told_where_it_is_cached(
    start_app: Any, sim_pods: Any, envoy: Any, tmp_path: Path
) -> None:
    fleet = await sim_pods(2)
    app = await start_app(fleet.ports, CONFIG, allow_experimental_plugins=True)
    log = tmp_path / "access.log"
    line = "%REQ(X-REQUEST-ID)% %REQ(X-KV-CACHE-SOURCE-HOST-PORT)%"
    proxy = envoy(app, **logging_envoy(app, log, line))
    url = f"{proxy.url}/v1/completions"
    long_prompt = {**COMPLETION, "prompt": "".join(f"{i:08d}" for i in range(512))}  # 4096 B

    status, first, _ = await post(url, long_prompt, {"x-request-id": "first"})
    assert status == 200
    served = int(first["x-sim-pod"].removeprefix("pod-"))
    other = 1 - served
    await set_overrides(fleet.urls[served], num_requests_waiting=8)  # the cached pod is busy
    busy = fleet.ports[served]
    await settle(app, lambda m: m[busy] is not None and m[busy].waiting_queue_size == 8)

    forged = {"x-request-id": "second", "x-kv-cache-source-host-port": "10.0.0.1:1"}
    status, second, _ = await post(url, long_prompt, forged)
    assert status == 200
    assert second["x-sim-pod"] == f"pod-{other}"
    fresh = {**COMPLETION, "prompt": "nothing cached anywhere " * 200}
    status, _, _ = await post(url, fresh, {"x-request-id": "third"})
    assert status == 200

    await wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 3, 15)
    logged = dict(row.split(" ", 1) for row in log.read_text().splitlines())
    assert logged["first"] == "-"  # nobody cached anything yet
    assert logged["second"] == f"127.0.0.1:{busy}"
    assert logged["third"] == "-"
