"""The ``epp-buffered`` bench target really runs Envoy's buffered config: a request is routed
by the EPP, and the EPP sees no response message (so it records no time to first byte)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from epp_tools.bench.fleet import SimProcess
from epp_tools.bench.runner import targets
from epp_tools.bench.workloads.catalog import build
from epp_tools.bench.workloads.spec import MODEL, FleetSpec
from epp_tools.stack.procs import direct_opener

pytestmark = [pytest.mark.envoy, pytest.mark.timeout(300)]


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize(("key", "ttfts"), [("epp-buffered", 0.0), ("epp", 1.0)])
def test_only_the_buffered_target_keeps_the_response_from_the_epp(
    tmp_path: Path, key: str, ttfts: float
) -> None:
    fleet = SimProcess(FleetSpec(pods=2), tmp_path / "sim").start(timeout=120)
    try:
        running = targets.start(key, fleet, build("a"), tmp_path / key)
        try:
            body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4}).encode()
            request = urllib.request.Request(
                f"{running.url}/v1/completions", body, {"content-type": "application/json"}
            )
            with direct_opener().open(request, timeout=30) as answer:
                assert answer.status == 200 and json.loads(answer.read())["choices"]
            with direct_opener().open(running.metrics_url, timeout=10) as page:
                metrics = page.read().decode()
        finally:
            running.stop()
    finally:
        fleet.stop()
    assert _metric(metrics, "llm_d_epp_request_total{") == 1.0
    assert _metric(metrics, "llm_d_epp_request_ttft_seconds_count{") == ttfts
