"""Request-path metrics upstream's dashboards read, through a real Envoy: streaming inter-token
latency and time per output token, and the EPP's own request and response processing time."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.conftest import COMPLETION, metrics_text, post

pytestmark = [pytest.mark.envoy]
RESPONSE_PROCESSING = "llm_d_epp_response_processing_duration_seconds"


def _count(text: str, family: str) -> float:
    found = re.findall(rf"^{family}_count(?:{{[^}}]*}})? (\S+)$", text, re.M)
    return sum(float(v) for v in found)


async def test_streamed_request_records_itl_tpot_and_processing_times_when_served(
    start_app: Any, sim_pods: Any, envoy: Any
) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports, response_body_sample_ratio=1.0)  # every body read
    proxy = envoy(app)
    streamed = {**COMPLETION, "max_tokens": 6, "stream": True}
    streamed["stream_options"] = {"include_usage": True}
    status, _, body = await post(f"{proxy.url}/v1/completions", streamed)
    assert status == 200 and body.count(b"data:") >= 6
    status, _, _ = await post(f"{proxy.url}/v1/completions", COMPLETION)  # not streamed
    assert status == 200

    async with asyncio.timeout(10):  # the response is recorded when its ext_proc stream ends
        while _count(text := await metrics_text(app), RESPONSE_PROCESSING) < 2:
            await asyncio.sleep(0.05)
    assert _count(text, RESPONSE_PROCESSING) == 2
    assert _count(text, "llm_d_epp_request_processing_duration_seconds") == 2
    assert _count(text, "llm_d_epp_request_streaming_itl_seconds") >= 1  # chunks after the first
    assert _count(text, "llm_d_epp_request_streaming_tpot_seconds") == 1  # the streamed one only
