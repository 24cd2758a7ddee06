"""``models-data-source`` + ``models-data-extractor`` in a running EPP against simulated vLLM pods:
each endpoint carries the models its ``/v1/models`` lists, shown by ``/debug/endpoints``, while
requests are routed through Envoy as usual."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from epp.plugin.attributes import SERVED_MODELS
from tests.conftest import COMPLETION, post, wait_for

pytestmark = [pytest.mark.envoy]

CONFIG = """\
plugins:
- type: models-data-source
  name: vllm-models-source
  parameters: {interval: 100ms}
- type: models-data-extractor
- type: queue-scorer
dataLayer:
  sources:
  - pluginRef: vllm-models-source
    extractors:
    - pluginRef: models-data-extractor
"""


def _served(app: Any) -> dict[int, list[tuple[str, str]]]:
    out = {}
    for e in app.store.snapshot():
        models = e.metrics.attributes.get(SERVED_MODELS) if e.metrics is not None else None
        if models:
            out[e.port] = [(m.id, m.parent) for m in models]
    return out


async def test_each_endpoint_carries_the_models_it_serves(start_app, sim_pods, envoy) -> None:
    plain = await sim_pods(1, model="sim-model")
    adapters = await sim_pods(1, model="sim-model", lora_adapters=("sql-lora",))
    ports = [plain.ports[0], adapters.ports[0]]
    app = await start_app(ports, CONFIG)
    expected = {
        ports[0]: [("sim-model", "")],
        ports[1]: [("sim-model", ""), ("sql-lora", "sim-model")],
    }
    await wait_for(lambda: _served(app) == expected)
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{app.metrics_port}/debug/endpoints") as r,
    ):
        listed = (await r.json())["endpoints"]
    attributes = {e["address"]: e["metrics"]["attributes"] for e in listed}
    models = attributes[f"127.0.0.1:{ports[1]}"][SERVED_MODELS]
    assert [m["id"] for m in models] == ["sim-model", "sql-lora"]
    proxy = envoy(app)
    status, _, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)
    assert status == 200
