"""``data-parallel-profile-handler`` through a real Envoy: two data-parallel ranks of one pod
(one address, a port each, as file discovery lists them), the primary port's pod receives the
request and the rank the EPP picked is named in ``x-data-parallel-host-port`` (the simulator
echoes it as ``x-sim-saw-data-parallel``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from epp.app import App
from epp.plugins.sources.file_discovery import dump_endpoints
from tests.conftest import COMPLETION, epp_config, make_settings, post, registry_with_test_plugins

pytestmark = [pytest.mark.envoy]


@pytest.mark.parametrize("rank", [0, 1])
async def test_request_goes_to_primary_port_with_the_picked_rank_when_data_parallel(
    rank: int, tmp_path: Path, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(2)
    primary, ranks = fleet.ports[0], fleet.ports
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        dump_endpoints((f"vllm-0-rank-{i}", "127.0.0.1", port) for i, port in enumerate(ranks))
    )
    body = f"""\
        plugins:
        - type: data-parallel-profile-handler
          parameters: {{primaryPort: {primary}}}
        - type: test-constant-scorer
          parameters: {{value: 1.0, ports: [{ranks[rank]}]}}
        """
    settings = make_settings(epp_config(endpoints, body))
    async with App(settings, registry=registry_with_test_plugins()) as app:
        await app.wait_ready(60)
        assert sorted(e.id for e in app.store.snapshot()) == [
            "default/vllm-0-rank-0",
            "default/vllm-0-rank-1",
        ]
        proxy = envoy(app)
        forged = {"x-data-parallel-host-port": "127.0.0.1:1"}
        for _ in range(3):
            status, headers, _ = await post(f"{proxy.url}/v1/completions", COMPLETION, forged)
            assert status == 200
            assert headers["x-sim-pod"] == "pod-0"  # the primary port's pod (the sidecar)
            assert headers["x-sim-saw-data-parallel"] == f"127.0.0.1:{ranks[rank]}"
