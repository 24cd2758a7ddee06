"""The admin gRPC API on a live stack (EPP + simulated vLLM pods + Envoy), through its real
command-line clients: ``epp explain`` shows the scores ``/debug/decisions`` records for the same
request routed through Envoy, and explaining leaves no trace; ``epp endpoints`` and ``epp state``
report the pool; a configured bearer token is enforced."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import COMPLETION, post, set_overrides, settle

# Each test starts the command-line client up to four times, a new Python process each: on a
# busy machine a start alone takes tens of seconds, so the bounds are generous (failure only).
pytestmark = [pytest.mark.envoy, pytest.mark.timeout(600)]
EPP = str(Path(sys.executable).parent / "epp")
BODY = json.dumps({**COMPLETION, "prompt": "explain this request " * 20})


async def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [EPP, *args], capture_output=True, text=True, timeout=300
    )


async def _decision(app: Any, request_id: str) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{app.metrics_port}/debug/decisions/{request_id}"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.json()


def _scores(profiles: Any) -> dict[str, dict[str, Any]]:
    """profile → endpoint → (total, per-scorer scores), from either view."""
    items = profiles.items() if isinstance(profiles, dict) else ((p["name"], p) for p in profiles)
    return {
        name: {s["endpoint"]: (round(s["total"], 6), s.get("scorers", {})) for s in p["scores"]}
        for name, p in items
    }


async def _stack(start_app: Any, sim_pods: Any, **settings: Any) -> Any:
    fleet = await sim_pods(3)
    for url, (waiting, kv) in zip(fleet.urls, [(3, 0.5), (0, 0.2), (1, 0.9)], strict=True):
        await set_overrides(url, num_requests_waiting=waiting, num_requests_running=0,
                            kv_cache_usage_perc=kv)  # fmt: skip
    app = await start_app(fleet.ports, secure_serving=True, **settings)
    await settle(app, lambda m: all(x is not None and x.waiting_queue_size in (0, 1, 3)
                                    and x.update_time for x in m.values()))  # fmt: skip
    return app


async def test_explain_shows_the_scores_debug_decisions_records_for_the_routed_request(
    start_app, sim_pods, envoy
) -> None:
    app = await _stack(start_app, sim_pods)
    target = ["--insecure", "--address", f"127.0.0.1:{app.grpc_port}"]
    run = await _cli("explain", *target, "-d", BODY, "-H", "x-request-id: explained", "--json")
    assert run.returncode == 0, run.stderr
    explained = json.loads(run.stdout)
    assert explained["outcome"] == "scheduled"
    assert explained["candidates"] == 3
    assert (await _decision(app, "explained"))[0] == 404  # explaining recorded nothing

    proxy = envoy(app)
    status, headers, body = await post(
        f"{proxy.url}/v1/completions", BODY.encode(), {"x-request-id": "routed"}
    )
    assert status == 200, body
    code, decision = await _decision(app, "routed")
    assert code == 200, decision

    want, got = _scores(decision["profiles"]), _scores(explained["profiles"])
    assert got == want
    assert len(got["default"]) == 3
    assert all(len(scorers) == 3 for _, scorers in got["default"].values())
    assert explained["destination"] == decision["profiles"]["default"]["targets"][0]
    assert headers["x-sim-pod"] == "pod-1"  # the least loaded pod, as explained

    # Explain reads live state: the routed request's prefix is now cached on the pod it went to.
    again = await _cli("explain", *target, "-d", BODY, "--json")
    scores = json.loads(again.stdout)["profiles"][0]["scores"]
    prefix = {
        s["endpoint"]: s["scorers"]["prefix-cache-scorer/prefix-cache-scorer"] for s in scores
    }
    assert prefix[explained["destination"]] > 0
    assert all(v == 0 for e, v in prefix.items() if e != explained["destination"])

    rejected = await _cli("explain", *target, "-d", "{not json")
    assert rejected.returncode == 0, rejected.stderr
    assert "rejected: 400" in rejected.stdout

    table = await _cli("explain", *target, "-d", BODY)
    assert table.returncode == 0, table.stderr
    assert "queue-scorer/queue-scorer" in table.stdout
    assert (
        all(f"127.0.0.1:{p}" in table.stdout for p in app.store_ports)
        if hasattr(app, "store_ports")
        else True
    )


async def test_endpoints_and_state_report_the_pool(start_app, sim_pods) -> None:
    app = await _stack(start_app, sim_pods)
    target = ["--insecure", "--address", f"127.0.0.1:{app.grpc_port}"]
    run = await _cli("endpoints", *target, "--json")
    assert run.returncode == 0, run.stderr
    listed = {e["address"]: e for e in json.loads(run.stdout)["endpoints"]}
    ports = {e.hostport: e for e in app.store.snapshot()}
    assert set(listed) == set(ports)
    waiting = sorted(int(e.get("waitingQueueSize", 0)) for e in listed.values())
    assert waiting == [0, 1, 3]
    assert all(e["scraped"] and 0 <= e["ageSeconds"] < 60 for e in listed.values())
    assert {a: e["id"] for a, e in listed.items()} == {a: e.id for a, e in ports.items()}
    table = await _cli("endpoints", *target)
    assert table.returncode == 0 and "ENDPOINT" in table.stdout
    assert all(address in table.stdout for address in ports)

    run = await _cli("state", *target, "--json")
    assert run.returncode == 0, run.stderr
    state = json.loads(run.stdout)
    assert state["flowControl"]["enabled"] is False
    assert state["sharing"]["enabled"] is False
    dumps = {p["type"]: json.loads(p["json"]) for p in state["plugins"]}
    assert "entries" in dumps["approx-prefix-cache-producer"]
    table = await _cli("state", *target)
    assert "flow control: off" in table.stdout and "approx-prefix-cache-producer" in table.stdout


async def test_a_configured_token_is_required(start_app, sim_pods, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    app = await _stack(start_app, sim_pods, admin_token_file=str(token))
    target = ["--insecure", "--address", f"127.0.0.1:{app.grpc_port}"]
    refused = await _cli("endpoints", *target)
    assert refused.returncode == 1
    assert "UNAUTHENTICATED" in refused.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("guess")
    assert (await _cli("endpoints", *target, "--token-file", str(wrong))).returncode == 1
    allowed = await _cli("endpoints", *target, "--token-file", str(token))
    assert allowed.returncode == 0, allowed.stderr


async def test_the_debug_views_token_opens_the_admin_api_too(
    start_app, sim_pods, tmp_path: Path
) -> None:
    """No --admin-token-file: the metrics port's auth ($EPP_METRICS_TOKEN here) guards it."""
    app = await _stack(start_app, sim_pods, metrics_token="m3trics-7f")
    target = ["--insecure", "--address", f"127.0.0.1:{app.grpc_port}"]
    refused = await _cli("endpoints", *target)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    wrong = tmp_path / "wrong"
    wrong.write_text("guess")
    assert (await _cli("endpoints", *target, "--token-file", str(wrong))).returncode == 1
    good = tmp_path / "good"
    good.write_text("m3trics-7f")
    allowed = await _cli("endpoints", *target, "--token-file", str(good))
    assert allowed.returncode == 0, allowed.stderr
