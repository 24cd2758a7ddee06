"""``request-attribute-reporter`` through a real Envoy: the value its CEL expression computes from
the simulated pod's usage reaches Envoy as dynamic metadata, where the access log reads it with
``%DYNAMIC_METADATA(envoy.lb:x-cost)%`` (streamed and non-streamed responses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COMPLETION, post, wait_for
from tests.envoy_access_log import logging_envoy

pytestmark = [pytest.mark.envoy]

CONFIG = """\
    plugins:
    - type: queue-scorer
    - type: request-attribute-reporter
      name: cost
      parameters:
        attributes:
        - key: {name: x-cost}
          expression: usage.prompt_tokens + usage.completion_tokens * 10.0
          condition: has(usage.completion_tokens)
    """


async def test_the_cost_reaches_envoy_as_dynamic_metadata(
    start_app: Any, sim_pods: Any, envoy: Any, tmp_path: Path
) -> None:
    fleet = await sim_pods(1)
    app = await start_app(fleet.ports, CONFIG)
    log = tmp_path / "access.log"
    line = "%REQ(X-REQUEST-ID)% %DYNAMIC_METADATA(envoy.lb:x-cost)%"
    proxy = envoy(app, **logging_envoy(app, log, line))
    url = f"{proxy.url}/v1/completions"
    expected: dict[str, float] = {}
    for rid, stream in (("plain", False), ("streamed", True)):
        body = {**COMPLETION, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True}
        status, _, raw = await post(url, body, {"x-request-id": rid})
        assert status == 200, raw[:300]
        usage = _usage(raw)
        expected[rid] = usage["prompt_tokens"] + usage["completion_tokens"] * 10
    await wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 2, 15)
    logged = dict(line.split(" ", 1) for line in log.read_text().splitlines())
    assert {rid: float(value) for rid, value in logged.items()} == expected


def _usage(raw: bytes) -> dict[str, int]:
    """The usage block of a JSON response, or of the last SSE event that has one."""
    if raw.lstrip().startswith(b"{"):
        return json.loads(raw)["usage"]  # type: ignore[no-any-return]
    found: dict[str, int] = {}
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[len("data: ") :])
            found = event.get("usage") or found
    return found
