"""Every example config in ``deploy/configs/`` starts and answers a chat completion through a real
Envoy. Pods carry P/D roles (pod-0 prefill, pod-1 decode, pod-2 encode, pod-3 unlabeled), so a
config whose profile uses ``decode-filter`` is also checked never to send a request to the
prefill-only or encode-only pod. External services the configs point at (a vLLM render URL, KV
event publishers, a DCGM exporter) do not exist here: the EPP must start and route anyway.

``EPP_CONFIG_DIR=<folder>`` adds every ``*.yaml`` of that folder to the check, e.g. your own
configs or llm-d-router's ``deploy/config/``, unchanged (a discovery source is added to each)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp_tools.stack.eppconfig import epp_config_text
from tests.conftest import make_settings, post

pytestmark = [pytest.mark.envoy]

CONFIGS = [  # the EndpointPickerConfigs, not the endpoints file beside them
    p
    for p in sorted((Path(__file__).resolve().parents[2] / "deploy" / "configs").glob("*.yaml"))
    if "kind: EndpointPickerConfig" in p.read_text()
]
if os.environ.get("EPP_CONFIG_DIR"):
    CONFIGS += sorted(Path(os.environ["EPP_CONFIG_DIR"]).glob("*.yaml"))
ROLES = {0: "prefill", 1: "decode", 2: "encode"}
CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Say hello to the endpoint picker. " * 20}],
    "max_tokens": 4,
}


def _uses_decode_filter(text: str) -> bool:
    doc = yaml.safe_load(text)
    types = {p.get("name") or p["type"]: p["type"] for p in doc.get("plugins", [])}
    refs = [
        types.get(r["pluginRef"], r["pluginRef"])
        for profile in doc.get("schedulingProfiles", [])
        if profile.get("name") in ("default", "decode")
        for r in profile.get("plugins", [])
    ]
    return "decode-filter" in refs


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
async def test_example_config_starts_and_answers_through_envoy(
    path: Path, tmp_path: Path, sim_pods: Any, envoy: Any
) -> None:
    text = path.read_text()
    fleet = await sim_pods(4)
    async with contextlib.AsyncExitStack() as stack:
        if "data-parallel-profile-handler" in text:
            # The handler sends every request to the pod's primaryPort (8000), where llm-d's
            # sidecar forwards it to the rank: one simulated pod stands in for it there.
            await stack.enter_async_context(_primary_port_pod())
        await _route(path, text, tmp_path, fleet, envoy)


@contextlib.asynccontextmanager
async def _primary_port_pod() -> AsyncIterator[None]:
    from epp_tools.sim.config import PodConfig
    from epp_tools.sim.fleet import SimFleet

    fleet = SimFleet([PodConfig(name="primary", port=8000, time_scale=50.0)])
    try:
        await fleet.__aenter__()
    except OSError as exc:
        pytest.skip(f"port 8000 is taken ({exc}); the data-parallel handler routes there")
    try:
        yield
    finally:
        await fleet.__aexit__(None, None, None)


async def _route(path: Path, text: str, tmp_path: Path, fleet: Any, envoy: Any) -> None:
    from epp.app import App
    from tests.conftest import endpoints_yaml

    endpoints = tmp_path / "endpoints.yaml"
    labels = {i: {"llm-d.ai/role": role} for i, role in ROLES.items()}
    endpoints.write_text(endpoints_yaml(fleet.ports, labels=labels))
    settings = make_settings(epp_config_text(endpoints, (), text), allow_experimental_plugins=True)
    async with App(settings) as app:
        await app.wait_ready(60)
        proxy = envoy(app)
        # The conformance config routes only to the endpoints this header names.
        pick = {"test-epp-endpoint-selection": f"127.0.0.1:{fleet.ports[1]}"}
        served = []
        for _ in range(6):
            status, headers, body = await post(f"{proxy.url}/v1/chat/completions", CHAT, pick)
            assert status == 200, (status, body[:300])
            served.append(headers["x-sim-pod"])
    if _uses_decode_filter(text):
        assert not {"pod-0", "pod-2"} & set(served), served
