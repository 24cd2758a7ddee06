"""Conditional decode through a real Envoy to simulated pods: ``Prefer: if-available`` gets 412
until a pod caches the prompt's prefix, then goes to that pod (upstream's gate, spec §1.6)."""

from __future__ import annotations

import pytest

from tests.conftest import COMPLETION, post, settle

pytestmark = [pytest.mark.envoy]

PROMPT = "You are a careful assistant. " * 60  # ~1,700 bytes: several 64-token blocks


async def test_if_available_is_412_until_a_pod_caches_the_prefix(
    start_app, sim_pods, envoy
) -> None:
    fleet = await sim_pods(3)
    app = await start_app(fleet.ports)
    await settle(app, lambda m: all(x is not None and x.update_time for x in m.values()))
    proxy = envoy(app)
    url = f"{proxy.url}/v1/completions"
    body = {**COMPLETION, "prompt": PROMPT}
    conditional = {"prefer": "return=minimal, If-Available"}

    status, _, answer = await post(url, body, conditional)
    assert status == 412, answer
    assert (
        answer
        == b"inference error: PreconditionFailed - no decode worker has the requested KV cache"
    )

    status, headers, _ = await post(url, body)  # the full pipeline: routed, and now cached
    assert status == 200
    warm = headers["x-sim-pod"]

    status, headers, _ = await post(url, body, conditional)
    assert status == 200 and headers["x-sim-pod"] == warm
