"""llm-d's Helm chart ships a ``payload-agnostic.yaml`` config (passthrough parser,
``active-request-scorer`` and ``session-affinity-scorer``) for request formats the EPP cannot
parse. It starts here (its scorer is alpha upstream too, hence ``--allow-experimental-plugins``)
and routes through Envoy: any body is forwarded, and a client echoing ``x-session-token`` stays
on its pod."""

from __future__ import annotations

import pytest

from tests.conftest import post

pytestmark = [pytest.mark.envoy]

# The chart's config, as a user would mount it (without apiVersion/kind and discovery, which the
# test fixture adds).
PAYLOAD_AGNOSTIC = """\
plugins:
- type: passthrough-parser
- type: active-request-scorer
- type: session-affinity-scorer
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
    weight: 1
  - pluginRef: session-affinity-scorer
    weight: 1
"""


async def test_payload_agnostic_config_starts_and_routes(start_app, sim_pods, envoy) -> None:
    fleet = await sim_pods(4)
    app = await start_app(fleet.ports, PAYLOAD_AGNOSTIC, allow_experimental_plugins=True)
    assert app.pipeline.describe()["parsers"] == ["passthrough-parser/passthrough-parser"]
    proxy = envoy(app)
    body = {"model": "sim-model", "prompt": "any format at all", "max_tokens": 2}
    status, headers, _ = await post(f"{proxy.url}/v1/completions", body)
    assert status == 200, headers
    token, pod = headers["x-session-token"], headers["x-sim-pod"]
    for i in range(20):
        follow = {**body, "prompt": f"unrelated {i}"}
        status, headers, _ = await post(
            f"{proxy.url}/v1/completions", follow, {"x-session-token": token}
        )
        assert (status, headers["x-sim-pod"]) == (200, pod)
